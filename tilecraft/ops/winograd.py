"""Winograd's minimal filtering for 3x3 convolutions, NHWC: F(m x m, 3 x 3) (Lavin & Gray, 2016).

A stride-1 3x3 convolution computes each m x m block of outputs from an (m+2) x (m+2) tile
of inputs with 9 m^2 multiplies a channel pair; Winograd's algorithm needs (m+2)^2 (16 for
F(2x2), 36 for F(4x4): 2.25x and 4x fewer). It is three kernels in tilecraft:

- ``winograd_input``: each tile of the padded input to the transformed domain,
  ``V[e, p, c] = sum_k BB[e, k] * tile_p[k, c]``, where ``BB = kron(B^T, B^T)``;
- ``winograd_matmul``: one matrix product per point ``e`` of the transformed tile,
  ``M[e, p, f] = sum_c V[e, p, c] * U[e, c, f]``, with the weights ``U = G g G^T``
  transformed once, at compile time (``winograd_weights``);
- ``winograd_output``: each tile back to its m x m outputs, ``Y = kron(A^T, A^T) M``.

The products are most of the work ((m+2)^2 x F multiply-adds for a tile and an input
channel, against (m+2)^4 for its transform), so they are the matrix product that the search
tiles as it tiles any other; the transforms read their small constant matrices as inputs,
which keeps each of them one sum.
"""

from __future__ import annotations

import numpy as np

from .. import te
from ..errors import TeError
from ..te.tensor import Tensor
from .common import check_tensor, layout_free, padding4, same_dtype
from .transform import pad

KERNEL = 3  # the filter size the transforms below are for

# Lavin & Gray's matrices, by output tile size m: (B^T, G, A^T); the input tile is m + 2.
_MATRICES = {
    2: ([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]],
        [[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]],
        [[1, 1, 1, 0], [0, 1, -1, -1]]),
    4: ([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0], [0, -2, -1, 2, 1, 0],
         [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]],
        [[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6], [1 / 24, 1 / 12, 1 / 6],
         [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]],
        [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]]),
}
TILE_SIZES = tuple(_MATRICES)


def _matrices(m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if m not in _MATRICES:
        raise TeError(f"winograd: output tile size {m} is not one of {TILE_SIZES}; use 2 or 4")
    return tuple(np.array(matrix, dtype=np.float64) for matrix in _MATRICES[m])


def input_transform(m: int) -> np.ndarray:
    """``kron(B^T, B^T)``: [(m+2)^2, (m+2)^2], a tile (row-major) to the transformed domain."""
    bt, _, _ = _matrices(m)
    return np.kron(bt, bt).astype(np.float32)


def output_transform(m: int) -> np.ndarray:
    """``kron(A^T, A^T)``: [m^2, (m+2)^2], a transformed tile to its m x m outputs (row-major)."""
    _, _, at = _matrices(m)
    return np.kron(at, at).astype(np.float32)


def winograd_weights(kernel: np.ndarray, m: int) -> np.ndarray:
    """An HWIO 3x3 kernel [3, 3, C, F] transformed, ``G g G^T``: [(m+2)^2, C, F] (float64 math)."""
    if kernel.ndim != 4 or kernel.shape[:2] != (KERNEL, KERNEL):
        raise TeError(f"winograd_weights: the kernel must be HWIO [3, 3, C, F], got {kernel.shape}")
    _, g, _ = _matrices(m)
    alpha = m + KERNEL - 1
    transformed = np.einsum("ai,ijcf,bj->abcf", g, kernel.astype(np.float64), g)
    return transformed.reshape(alpha * alpha, *kernel.shape[2:]).astype(kernel.dtype)


def tiles(size: int, m: int) -> int:
    """How many m-wide output tiles cover ``size`` outputs."""
    return -(-size // m)


def winograd_input(data: Tensor, transform: Tensor, m: int, padding: int | tuple = 0,
                   name: str = "winograd_input") -> Tensor:
    """data [N, H, W, C], ``transform`` = ``input_transform(m)`` -> V [(m+2)^2, P, C], where P
    counts the output tiles (n, tile row, tile column) of a stride-1 3x3 convolution with
    ``padding`` (as conv2d_nhwc takes it); the input is padded with zeros past the last tile."""
    op = "winograd_input"
    check_tensor(data, op, 4, "data")
    check_tensor(transform, op, 2, "transform")
    same_dtype(data, transform, op)
    alpha = m + KERNEL - 1
    if tuple(transform.shape) != (alpha * alpha, alpha * alpha):
        raise TeError(f"{op}: the transform {transform.name} {transform.shape} must be "
                      f"[{alpha * alpha}, {alpha * alpha}] for tiles of {m}: ops.winograd.input_transform({m})")
    N, H, W, C = data.shape
    top, left, bottom, right = padding4(padding, op)
    OH, OW = H + top + bottom - KERNEL + 1, W + left + right - KERNEL + 1
    if OH < 1 or OW < 1:
        raise TeError(f"{op}: data {data.shape} padded by {padding} is smaller than the 3x3 kernel")
    TH, TW = tiles(OH, m), tiles(OW, m)
    extra_h, extra_w = TH * m + KERNEL - 1 - (H + top), TW * m + KERNEL - 1 - (W + left)
    padded = pad(data, (0, top, left, 0), (0, extra_h, extra_w, 0), name=f"{name}_pad")
    k = te.reduce_axis((0, alpha * alpha), "k")

    def body(e, p, c):
        n, rest = p // (TH * TW), p % (TH * TW)
        value = padded[n, rest // TW * m + k.var // alpha, rest % TW * m + k.var % alpha, c]
        return te.sum(transform[e, k] * value, axis=k)

    return te.compute((alpha * alpha, N * TH * TW, C), body, name=name)


def winograd_matmul(transformed: Tensor, weights: Tensor, name: str = "winograd_matmul") -> Tensor:
    """V [E, P, C] and transformed weights U [E, C, F] (``winograd_weights``) -> M [E, P, F],
    one product a point of the transformed tile, the weights free to be re-laid out."""
    op = "winograd_matmul"
    check_tensor(transformed, op, 3, "transformed input")
    check_tensor(weights, op, 3, "weights")
    same_dtype(transformed, weights, op)
    E, P, C = transformed.shape
    if weights.shape[:2] != (E, C):
        raise TeError(f"{op}: weights {weights.name} {weights.shape} must be [{E}, {C}, F] to match the "
                      f"transformed input {transformed.name} {transformed.shape}")
    c = te.reduce_axis((0, C), "c")
    return te.compute((E, P, weights.shape[2]), lambda e, p, f: te.sum(transformed[e, p, c] * weights[e, c, f],
                                                                         axis=c), name=name, attrs=layout_free(weights))


def winograd_output(product: Tensor, transform: Tensor, m: int, shape: tuple[int, int, int],
                    name: str = "winograd_output") -> Tensor:
    """M [(m+2)^2, P, F] and ``transform`` = ``output_transform(m)`` -> Y [N, OH, OW, F] for
    ``shape`` = (N, OH, OW): the convolution's output, tiles past its edges dropped."""
    op = "winograd_output"
    check_tensor(product, op, 3, "product")
    check_tensor(transform, op, 2, "transform")
    same_dtype(product, transform, op)
    alpha = m + KERNEL - 1
    N, OH, OW = shape
    TH, TW = tiles(OH, m), tiles(OW, m)
    if tuple(transform.shape) != (m * m, alpha * alpha) or tuple(product.shape[:2]) != (alpha * alpha, N * TH * TW):
        raise TeError(f"{op}: product {product.shape} and transform {transform.shape} do not fit tiles of {m} "
                      f"over an output of {shape}: expected [{alpha * alpha}, {N * TH * TW}, F] and "
                      f"[{m * m}, {alpha * alpha}]")
    e = te.reduce_axis((0, alpha * alpha), "e")

    def body(n, y, x, f):
        tile = (n * TH + y // m) * TW + x // m
        return te.sum(transform[y % m * m + x % m, e] * product[e, tile, f], axis=e)

    return te.compute((N, OH, OW, product.shape[2]), body, name=name)
