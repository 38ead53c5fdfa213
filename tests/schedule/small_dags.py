"""Small computations that several schedule tests build on."""

import tilecraft as tc
from tilecraft import te


def matmul_relu():
    """A 16x8 @ 8x12 matmul ``C`` and its ReLU ``D``: (the DAG, C, D)."""
    A = te.placeholder((16, 8), name="A")
    B = te.placeholder((8, 12), name="B")
    k = te.reduce_axis((0, 8), name="k")
    C = te.compute((16, 12), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    D = te.compute((16, 12), lambda i, j: te.max(C[i, j], 0.0), name="D")
    return tc.ComputeDAG([A, B, D]), C, D
