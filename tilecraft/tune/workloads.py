"""Built-in workloads, registered by name: what ``tilecraft tune NAME`` and the
benchmarks tune. Each returns its tensors, inputs first and outputs last."""

from __future__ import annotations

from .. import ops, te
from ..ops.common import product_of
from .task import register_workload


@register_workload
def matmul(N: int, L: int, M: int, dtype: str = "float32", out_dtype: str | None = None):
    """C = A @ B, with B a weight whose layout the tuner may choose (Ansor's tutorial); summed
    into ``out_dtype`` where given (bfloat16 into float32, as TVM's out_dtype)."""
    A = te.placeholder((N, L), name="A", dtype=dtype)
    B = te.placeholder((L, M), name="B", dtype=dtype)
    k = te.reduce_axis((0, L), name="k")
    C = te.compute((N, M), lambda i, j: te.sum(product_of(A[i, k], B[k, j], out_dtype), axis=k),
                   name="matmul", attrs={"layout_free_placeholders": [B]})
    return [A, B, C]


@register_workload
def matmul_add(N: int, L: int, M: int, dtype: str = "float32"):
    """The Ansor tutorial's workload: a matmul and an element-wise add."""
    A, B, product = matmul(N, L, M, dtype)
    C = te.placeholder((N, M), name="C", dtype=dtype)
    out = te.compute((N, M), lambda i, j: product[i, j] + C[i, j], name="out")
    return [A, B, C, out]


@register_workload
def dense(batch: int, in_features: int, out_features: int, dtype: str = "float32", multiple: int = 1):
    """``X @ W.T``, W of shape ``(out_features, in_features)``, as a fully connected layer; its
    sizes padded to a ``multiple`` (16: tensor cores' tiles)."""
    X = te.placeholder((batch, in_features), name="X", dtype=dtype)
    W = te.placeholder((out_features, in_features), name="W", dtype=dtype)
    return [X, W, ops.dense(X, W, multiple=multiple)]


@register_workload
def batch_matmul(batch: int, N: int, L: int, M: int, dtype: str = "float32"):
    """``batch`` independent ``(N, L) @ (L, M)`` matmuls."""
    A = te.placeholder((batch, N, L), name="A", dtype=dtype)
    B = te.placeholder((batch, L, M), name="B", dtype=dtype)
    return [A, B, ops.batch_matmul(A, B)]


@register_workload
def conv2d(N: int, C: int, H: int, W: int, F: int, KH: int, KW: int, stride: int = 1, padding: int = 0,
           dtype: str = "float32"):
    """NCHW convolution followed by a bias and ReLU, as in ResNet."""
    data = te.placeholder((N, C, H, W), name="data", dtype=dtype)
    kernel = te.placeholder((F, C, KH, KW), name="kernel", dtype=dtype)
    bias = te.placeholder((F,), name="bias", dtype=dtype)
    conv = ops.conv2d_nchw(data, kernel, stride=stride, padding=padding)
    biased = te.compute(conv.shape, lambda n, f, y, x: conv[n, f, y, x] + bias[f], name="bias_add")
    return [data, kernel, bias, ops.relu(biased)]


@register_workload
def conv2d_nhwc(N: int, H: int, W: int, C: int, F: int, KH: int, KW: int, stride: int = 1, padding: int = 0,
                dtype: str = "float32"):
    """NHWC convolution (HWIO kernel) followed by a bias and ReLU: the layout in which
    output channels are the contiguous, vectorizable axis."""
    data = te.placeholder((N, H, W, C), name="data", dtype=dtype)
    kernel = te.placeholder((KH, KW, C, F), name="kernel", dtype=dtype)
    bias = te.placeholder((F,), name="bias", dtype=dtype)
    conv = ops.conv2d_nhwc(data, kernel, stride=stride, padding=padding)
    biased = te.compute(conv.shape, lambda n, y, x, f: conv[n, y, x, f] + bias[f], name="bias_add")
    return [data, kernel, bias, ops.relu(biased)]


@register_workload
def conv2d_nhwc_gemm(N: int, H: int, W: int, C: int, F: int, KH: int, KW: int, stride: int = 1, padding: int = 0,
                     dtype: str = "float32", multiple: int = 1):
    """``conv2d_nhwc`` (and its bias and ReLU) as one matrix product of its pixels' windows
    by its kernel (implicit GEMM, ``ops.conv2d_nhwc_gemm``), rows of output pixels: in
    float16 on a GPU, a product for tensor cores; its sizes padded to a ``multiple`` (16:
    tensor cores' tiles)."""
    data = te.placeholder((N, H, W, C), name="data", dtype=dtype)
    kernel = te.placeholder((KH, KW, C, F), name="kernel", dtype=dtype)
    bias = te.placeholder((F,), name="bias", dtype=dtype)
    conv = ops.conv2d_nhwc_gemm(data, kernel, stride, padding, multiple=multiple)
    biased = te.compute(conv.shape, lambda m, f: conv[m, f] + bias[f], name="bias_add")
    return [data, kernel, bias, ops.relu(biased)]


@register_workload
def softmax(rows: int, columns: int, dtype: str = "float32"):
    """Softmax of each row: four stages (max, exp, sum, division)."""
    x = te.placeholder((rows, columns), name="x", dtype=dtype)
    return [x, ops.softmax(x)]


@register_workload
def layer_norm(rows: int, columns: int, dtype: str = "float32"):
    """Layer normalisation of each row, scaled by ``gamma`` and shifted by ``beta`` (epsilon 1e-5)."""
    x = te.placeholder((rows, columns), name="x", dtype=dtype)
    gamma = te.placeholder((columns,), name="gamma", dtype=dtype)
    beta = te.placeholder((columns,), name="beta", dtype=dtype)
    return [x, gamma, beta, ops.layer_norm(x, gamma, beta)]
