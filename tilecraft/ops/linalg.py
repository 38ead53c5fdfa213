"""Matrix products: matmul, dense (a fully connected layer), batch_matmul, and a matrix applied along one axis.

Each is one reduction compute, the pattern Ansor's multi-level tiling is built for;
``dense`` marks its weight placeholder layout-free so the scheduler may pre-pack it.
"""

from __future__ import annotations

from typing import Callable

from .. import te
from ..errors import TeError
from ..te.tensor import Tensor
from .common import (broadcast_shape, check_tensor, compute_nd, cropped, layout_free, normalize_axis, padded_to,
                     product_of, rounded_up, same_dtype)


def _check_reduction(a_shape, a_size, b_shape, b_size, a_name, b_name, op) -> None:
    if a_size != b_size:
        raise TeError(
            f"{op}: the reduction sizes differ: {a_name} {tuple(a_shape)} gives {a_size} but {b_name} "
            f"{tuple(b_shape)} gives {b_size}; check the shapes and the transpose flags"
        )


def matmul(A: Tensor, B: Tensor, transpose_a: bool = False, transpose_b: bool = False, multiple: int = 1,
           name: str = "matmul", out_dtype: str | None = None) -> Tensor:
    """``op(A) @ op(B)``: A is [M, K] ([K, M] if transpose_a), B is [K, N] ([N, K] if transpose_b).
    M, K and N are each padded up to a ``multiple`` (``_on_whole_tiles``); summed in
    ``out_dtype`` where given (``product_of``), else in A's and B's type."""
    check_tensor(A, "matmul", 2, "first operand")
    check_tensor(B, "matmul", 2, "second operand")
    same_dtype(A, B, "matmul")
    M, K = reversed(A.shape) if transpose_a else A.shape
    K_b, N = reversed(B.shape) if transpose_b else B.shape
    _check_reduction(A.shape, K, B.shape, K_b, A.name, B.name, "matmul")

    def product(A, B, K, name):
        k = te.reduce_axis((0, K), name="k")
        return te.compute((A.shape[1] if transpose_a else A.shape[0], B.shape[0] if transpose_b else B.shape[1]),
                          lambda i, j: te.sum(product_of(A[k, i] if transpose_a else A[i, k],
                                                         B[j, k] if transpose_b else B[k, j], out_dtype), axis=k),
                          name=name)

    return _on_whole_tiles(product, A, B, (M, K, N), (transpose_a, transpose_b), multiple, name, "matmul")


def dense(X: Tensor, W: Tensor, bias: Tensor | None = None, multiple: int = 1, name: str = "dense",
          out_dtype: str | None = None) -> Tensor:
    """``X @ W.T (+ bias)``: X is [batch, in], W is [out, in], bias is [out] (``topi.nn.dense``);
    its sizes each padded up to a ``multiple`` (``_on_whole_tiles``); summed in ``out_dtype``
    where given (``product_of``).

    The bias is a second compute, ``{name}_bias_add``.
    """
    check_tensor(X, "dense", 2, "data")
    check_tensor(W, "dense", 2, "weight")
    same_dtype(X, W, "dense")
    _check_reduction(X.shape, X.shape[1], W.shape, W.shape[1], X.name, W.name, "dense")

    def product(X_, W_, K, name):
        k = te.reduce_axis((0, K), name="k")
        return te.compute((X_.shape[0], W_.shape[0]), lambda i, j: te.sum(product_of(X_[i, k], W_[j, k], out_dtype),
                                                                            axis=k), name=name, attrs=layout_free(W))

    out = _on_whole_tiles(product, X, W, (X.shape[0], X.shape[1], W.shape[0]), (False, True), multiple, name, "dense")
    if bias is None:
        return out
    check_tensor(bias, "dense", 1, "bias")
    same_dtype(X, bias, "dense")
    if bias.shape[0] != W.shape[0]:
        raise TeError(f"dense: bias {bias.name} {bias.shape} must have the {W.shape[0]} outputs of weight "
                      f"{W.name} {W.shape}")
    return te.compute(out.shape, lambda i, j: out[i, j] + bias[j], name=f"{name}_bias_add")


def batch_matmul(A: Tensor, B: Tensor, transpose_a: bool = False, transpose_b: bool = False, multiple: int = 1,
                 name: str = "batch_matmul", out_dtype: str | None = None) -> Tensor:
    """Batched ``op(A) @ op(B)``: A is [batch, M, K], B is [batch, K, N] (per-matrix transposes as
    in matmul), M, K and N each padded up to a ``multiple`` (``_on_whole_tiles``); summed in
    ``out_dtype`` where given (``product_of``).

    A batch of 1 broadcasts against the other operand's batch.
    """
    check_tensor(A, "batch_matmul", 3, "first operand")
    check_tensor(B, "batch_matmul", 3, "second operand")
    same_dtype(A, B, "batch_matmul")
    (batch,) = broadcast_shape(A.shape[:1], B.shape[:1], "batch_matmul")
    M, K = reversed(A.shape[1:]) if transpose_a else A.shape[1:]
    K_b, N = reversed(B.shape[1:]) if transpose_b else B.shape[1:]
    _check_reduction(A.shape, K, B.shape, K_b, A.name, B.name, "batch_matmul")

    def product(A, B, K, name):
        k = te.reduce_axis((0, K), name="k")

        def body(b, i, j):
            batch_a = b if A.shape[0] != 1 else 0
            batch_b = b if B.shape[0] != 1 else 0
            a = A[batch_a, k, i] if transpose_a else A[batch_a, i, k]
            rhs = B[batch_b, j, k] if transpose_b else B[batch_b, k, j]
            return te.sum(product_of(a, rhs, out_dtype), axis=k)

        return te.compute((batch, A.shape[2] if transpose_a else A.shape[1], B.shape[1] if transpose_b else B.shape[2]),
                          body, name=name)

    return _on_whole_tiles(product, A, B, (M, K, N), (transpose_a, transpose_b), multiple, name, "batch_matmul")


def _on_whole_tiles(product: Callable, A: Tensor, B: Tensor, sizes: tuple[int, int, int], transposed: tuple[bool, bool],
                    multiple: int, name: str, op: str) -> Tensor:
    """``product(A, B, K, name)`` of A [.., M, K] and B [.., K, N] (each transposed or not, a
    batch leading), with M, K and N padded up to a ``multiple``: where one is not, A and B are
    grown with zeros (``{name}_a``, ``{name}_b``, stages a schedule inlines into the tiles it
    fetches) and the product (``{name}_padded``) cropped, the sizes tensor cores take
    (``GpuTensorCoreTiling``): a ViT's 197 tokens, 208 rows."""
    (M, _, N), (Mp, Kp, Np) = sizes, rounded_up(sizes, multiple, op)
    a_shape = (Kp, Mp) if transposed[0] else (Mp, Kp)
    b_shape = (Np, Kp) if transposed[1] else (Kp, Np)
    A = padded_to(A, (*A.shape[:-2], *a_shape), f"{name}_a")
    B = padded_to(B, (*B.shape[:-2], *b_shape), f"{name}_b")
    out = product(A, B, Kp, name if (Mp, Np) == (M, N) else f"{name}_padded")
    return cropped(out, (*out.shape[:-2], M, N), name)


def axis_matmul(x: Tensor, weight: Tensor, axis: int, name: str = "axis_matmul") -> Tensor:
    """``weight`` [M, K] applied along ``axis`` of ``x`` (of size K), the other dims kept:
    ``out[..., m, ...] = sum_k weight[m, k] * x[..., k, ...]`` (a separable resampling, one axis at a time)."""
    check_tensor(x, "axis_matmul", what="data")
    check_tensor(weight, "axis_matmul", 2, "weight")
    same_dtype(x, weight, "axis_matmul")
    axis = normalize_axis(axis, x.ndim, "axis_matmul")
    _check_reduction(x.shape, x.shape[axis], weight.shape, weight.shape[1], x.name, weight.name, "axis_matmul")
    k = te.reduce_axis((0, x.shape[axis]), name="k")
    shape = x.shape[:axis] + weight.shape[:1] + x.shape[axis + 1:]
    return compute_nd(shape, lambda idx: te.sum(weight[idx[axis], k] * x[idx[:axis] + (k,) + idx[axis + 1:]], axis=k),
                      name)
