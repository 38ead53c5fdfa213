"""Converters of ONNX operators: signal processing and algebra (DFT, STFT, MelWeightMatrix, Einsum, Det).

A DFT of a static length is linear, so it is one matrix product: the complex matrix
``exp(∓2πi·f·j/n)`` (scaled by ``1/n`` when inverse) is built with NumPy at import, as a real
matrix acting on the (real, imaginary) pairs of the trailing complex dim, and applied with
one ``dense`` to the signal axis and that dim merged. Everything that varies lives in the
matrix: a real input reads only its real columns, ``dft_length`` pads (zero columns) or
truncates, ``onesided`` keeps the first ``n/2+1`` rows, and an inverse onesided DFT (an
IRFFT, real output) weighs each bin twice for its mirror image, except the DC and Nyquist
ones. An ``n``-point DFT costs ``n^2`` per signal rather than an FFT's ``n log n``, fine for
the frame lengths of audio front ends, and ``dense`` is what the scheduler tiles best. STFT
gathers the frames with one ``take`` of constant positions, multiplies them by the window,
and applies the same matrix. MelWeightMatrix depends only on its constant inputs, so it is
computed at import with the formula of onnx's reference implementation.

Einsum is one ``ops.einsum`` node of the equation with its ``...`` spelled out as labels of
their own (a general contraction: one reduction over the dropped labels). Det is Gaussian
elimination with partial pivoting, unrolled over the static size ``n`` into graph nodes that
work on every matrix of the batch at once: each step picks the row of largest magnitude in
the first column (pivoting keeps float32 sound), multiplies the determinant by the pivot
(negated when the rows swap), and eliminates the first column from the remaining rows. A zero
pivot makes the determinant 0; it is divided by as 1 so that no NaN spreads. The graph grows
by about twenty nodes a row, meant for the small matrices models take determinants of.
"""

from __future__ import annotations

import math
import string
from typing import Callable

import numpy as np

from .. import ops
from ..graph.operators import HEAVY, OPERATORS, Operator
from ..te.dtype import is_float
from .onnx_importer import Importer, OnnxNode, checked_array

Converter = Callable[[Importer, OnnxNode], None]

OPERATORS["einsum"] = Operator(lambda inputs, attrs, name: ops.einsum(*inputs, **attrs, name=name), HEAVY)


def _dft_matrix(n_in: int, length: int, inverse: bool, onesided: bool, complex_in: int) -> np.ndarray:
    """The real [n_out, complex_out, n_in * complex_in] matrix of a ``length``-point DFT of ``n_in`` samples of
    ``complex_in`` parts each (interleaved); the output is complex, (real, imaginary), except an IRFFT's."""
    irfft = inverse and onesided
    rows = np.arange(length // 2 + 1 if onesided and not inverse else length)
    columns = np.arange(n_in)
    if irfft:  # the Hermitian image of bins 1..ceil(n/2)-1 doubles them; the imaginary parts of DC and Nyquist drop
        weights = np.where(columns > length // 2, 0, np.where((columns == 0) | (2 * columns == length), 1, 2))
    else:
        weights = columns < length
    turns = np.outer(rows, columns) % length / length  # exact phases, even for long transforms
    matrix = weights * np.exp((2j if inverse else -2j) * np.pi * turns) / (length if inverse else 1)
    blocks = np.array([[matrix.real, -matrix.imag], [matrix.imag, matrix.real]])[:1 if irfft else 2, :complex_in]
    return blocks.transpose(2, 0, 3, 1).reshape(len(rows), -1, n_in * complex_in)


def _apply_along(ctx: Importer, x: str, axis: int, matrix: np.ndarray, hint: str) -> str:
    """``matrix`` [n_out, complex_out, n_in * complex_in] applied to ``axis`` and the trailing complex dim of ``x``
    together: one ``dense`` over the rows of the other dims, transposed around it unless ``axis`` is the one
    before last already."""
    shape, rank = ctx.shape(x), len(ctx.shape(x))
    order = [d for d in range(rank - 1) if d != axis] + [axis, rank - 1]
    moved = x if order == list(range(rank)) else ctx.emit("transpose", [x], {"axes": tuple(order)}, f"{hint}_moved")
    others = [shape[d] for d in order[:-2]]
    rows = ctx.reshape(moved, (math.prod(others), matrix.shape[2]), f"{hint}_rows")
    weight = ctx.add_constant(ctx.fresh_value(f"{hint}_matrix"),
                              matrix.reshape(-1, matrix.shape[2]).astype(ctx.values[x].dtype))
    out = ctx.reshape(ctx.emit("dense", [rows, weight], {}, hint), (*others, *matrix.shape[:2]), f"{hint}_split")
    return out if order == list(range(rank)) else ctx.emit(
        "transpose", [out], {"axes": tuple(order.index(d) for d in range(rank))}, f"{hint}_back")


def _complex_axis(ctx: Importer, node: OnnxNode, x: str, axis: int) -> int:
    """``axis`` of ``x`` made non-negative, checked to be a signal axis of a real or complex signal."""
    shape = ctx.shape(x)
    if not -len(shape) <= axis < len(shape) - 1 or axis == -1 or shape[-1] not in (1, 2):
        raise node.unsupported(f"a transform along axis {axis} of shape {list(shape)} (the last dim, of size 1 or "
                               "2, holds the real and imaginary parts)")
    return axis % len(shape)


def _dft(ctx: Importer, node: OnnxNode) -> None:
    x = node.inputs[0]
    if node.opset >= 20:  # an input from opset 20 on, counting the complex dim
        given = ctx.constant(node, 2, "axis")
        axis = _complex_axis(ctx, node, x, -2 if given is None else int(given.reshape(())))
    else:
        axis = _complex_axis(ctx, node, x, node.attrs.get("axis", 1))
    inverse, onesided = bool(node.attrs.get("inverse", 0)), bool(node.attrs.get("onesided", 0))
    n_in, length = ctx.shape(x)[axis], ctx.constant(node, 1, "dft_length")
    length = int(length.reshape(())) if length is not None else 2 * (n_in - 1) if inverse and onesided else n_in
    matrix = _dft_matrix(n_in, length, inverse, onesided, ctx.shape(x)[-1])
    ctx.alias(node.outputs[0], _apply_along(ctx, x, axis, matrix, node.name))


def _stft(ctx: Importer, node: OnnxNode) -> None:
    signal, window = node.inputs[0], node.input(2)
    _, length, complex_in = ctx.shape(signal)
    step = int(ctx.constant(node, 1, "frame_step").reshape(()))
    frame_length = ctx.constant(node, 3, "frame_length")
    frame_length = int(frame_length.reshape(())) if frame_length is not None else (
        ctx.shape(window)[0] if window else length)
    starts = np.arange(1 + (length - frame_length) // step) * step
    positions = ctx.add_constant(ctx.fresh_value(f"{node.name}_positions"), starts[:, None] + np.arange(frame_length))
    frames = ctx.emit("take", [signal, positions], {"axis": 1}, f"{node.name}_frames")
    if window:
        frames = ctx.emit("multiply", [frames, ctx.reshape(window, (frame_length, 1), f"{node.name}_window")], {},
                          f"{node.name}_windowed")
    matrix = _dft_matrix(frame_length, frame_length, False, bool(node.attrs.get("onesided", 1)), complex_in)
    ctx.alias(node.outputs[0], _apply_along(ctx, frames, 2, matrix, node.name))


def _mel_weight_matrix(ctx: Importer, node: OnnxNode) -> None:
    """Triangles over the spectrogram bins, one per mel bin, rising from its left edge to 1 at its centre and
    falling to 0 at its right edge; the edges are as onnx's reference places them (spaced evenly in mel,
    floored to bins)."""
    import onnx

    bins, dft_length, sample_rate, lower, upper = (ctx.constant(node, k, what).reshape(()) for k, what in enumerate(
        ("num_mel_bins", "dft_length", "sample_rate", "lower_edge_hertz", "upper_edge_hertz")))
    low_mel, high_mel = (2595 * np.log1p(hertz / 700) / np.log(10) for hertz in (lower, upper))
    mels = np.arange(0, bins + 2) * ((high_mel - low_mel) / (bins + 2)) + low_mel
    edges = (((dft_length + 1) * (700 * np.expm1(mels / 2595 * np.log(10)))) // sample_rate).astype(int)
    left, centre, right = edges[:-2], edges[1:-1], edges[2:]
    j = np.arange(dft_length // 2 + 1)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):  # the empty sides, which np.where does not pick
        rising, falling = (j - left) / (centre - left), (right - j) / (right - centre)
    weights = np.where(j == centre, 1.0, np.where((left <= j) & (j < centre), rising,
                                                  np.where((centre < j) & (j < right), falling, 0.0)))
    dtype = onnx.helper.tensor_dtype_to_np_dtype(node.attrs.get("output_datatype", onnx.TensorProto.FLOAT))
    ctx.add_constant(node.outputs[0], checked_array(weights.astype(dtype), node.outputs[0]))


def _ellipsis_dims(ctx: Importer, x: str, labels: str) -> int:
    return len(ctx.shape(x)) - len(labels.replace("...", ""))


def _einsum(ctx: Importer, node: OnnxNode) -> None:
    """The equation made explicit for ``ops.einsum``: the ``...`` of each operand becomes its share of spare
    letters, aligned on the right as broadcasting aligns dims, and an implicit output (no ``->``) is the
    ``...`` dims then the labels used once, in alphabetical order."""
    equation = node.attrs["equation"].replace(" ", "")
    inputs, arrow, output = equation.partition("->")
    operands = list(zip(node.inputs, inputs.split(",")))
    spare = "".join(c for c in string.ascii_letters if c not in equation)[:max(
        _ellipsis_dims(ctx, x, labels) for x, labels in operands)]
    explicit = [labels.replace("...", spare[len(spare) - _ellipsis_dims(ctx, x, labels):]) for x, labels in operands]
    if not arrow:
        letters = inputs.replace("...", "")
        output = "..." + "".join(sorted(c for c in set(letters) if c != "," and letters.count(c) == 1))
    output = output.replace("...", spare)
    if len(explicit) == 1 and explicit[0] == output:
        return ctx.alias(node.outputs[0], node.inputs[0])
    ctx.emit_for(node, "einsum", node.inputs, {"equation": f"{','.join(explicit)}->{output}"})


def _slice(ctx: Importer, x: str, axis: int, begin: int, end: int, hint: str) -> str:
    return ctx.emit("strided_slice", [x], {"begin": (begin,), "end": (end,), "axes": (axis,)}, hint)


def _pivot(ctx: Importer, m: str, hint: str) -> tuple[str, str, str]:
    """Of the [batch, size, size] matrices ``m``: which row holds the largest magnitude of the first column
    ([batch, size, 1] bool), that row ([batch, 1, size]), and its pivot, negated when it is not the first
    row (the swap flips the determinant's sign)."""
    size = ctx.shape(m)[1]
    best = ctx.emit("argmax", [ctx.emit("abs", [_slice(ctx, m, 2, 0, 1, f"{hint}_column")], {}, f"{hint}_abs")],
                    {"axis": 1, "keepdims": True, "select_last_index": False}, f"{hint}_best")
    rows = ctx.add_constant(ctx.fresh_value(f"{hint}_rows"), np.arange(size).reshape(size, 1))
    chosen = ctx.emit("binary", [best, rows], {"function": "equal"}, f"{hint}_chosen")
    row = ctx.emit("sum", [ctx.emit("where", [chosen, m, ctx.scalar(0, m)], {}, f"{hint}_picked")],
                   {"axis": 1, "keepdims": True}, f"{hint}_pivot_row")
    signs = ctx.add_constant(ctx.fresh_value(f"{hint}_signs"), np.where(np.arange(size) == 0, 1, -1).astype(
        ctx.values[m].dtype))
    factor = ctx.emit("multiply", [_slice(ctx, row, 2, 0, 1, f"{hint}_pivot"),
                                   ctx.emit("take", [signs, best], {"axis": 0}, f"{hint}_sign")], {}, f"{hint}_factor")
    return chosen, row, factor


def _eliminate(ctx: Importer, m: str, chosen: str, row: str, hint: str) -> str:
    """The [batch, size - 1, size - 1] matrices left when the pivot ``row`` is swapped to the top of ``m`` and
    subtracted from the rows below it to zero their first column. A zero pivot (a zero column: the
    determinant is 0 already) is divided by as 1, so that no NaN spreads."""
    size = ctx.shape(m)[1]
    rest = _slice(ctx, ctx.emit("where", [chosen, _slice(ctx, m, 1, 0, 1, f"{hint}_top"), m], {}, f"{hint}_swap"),
                  1, 1, size, f"{hint}_rest")  # the top row takes the pivot row's place
    pivot = _slice(ctx, row, 2, 0, 1, f"{hint}_pivot")
    divisor = ctx.emit("where", [ctx.emit("binary", [pivot, ctx.scalar(0, m)], {"function": "equal"},
                                          f"{hint}_singular"), ctx.scalar(1, m), pivot], {}, f"{hint}_divisor")
    ratios = ctx.emit("divide", [_slice(ctx, rest, 2, 0, 1, f"{hint}_lead"), divisor], {}, f"{hint}_ratios")
    update = ctx.emit("multiply", [ratios, _slice(ctx, row, 2, 1, size, f"{hint}_tail")], {}, f"{hint}_update")
    return ctx.emit("subtract", [_slice(ctx, rest, 2, 1, size, f"{hint}_block"), update], {}, f"{hint}_eliminated")


def _det(ctx: Importer, node: OnnxNode) -> None:
    x = node.inputs[0]
    *batch, n, columns = ctx.shape(x)
    if n != columns or not is_float(ctx.values[x].dtype):
        raise node.unsupported(f"the determinant of a {ctx.values[x].dtype}{list(ctx.shape(x))} (square float "
                               "matrices only)")
    m, det = ctx.reshape(x, (math.prod(batch), n, n), f"{node.name}_batch"), None
    for step in range(n):
        hint = f"{node.name}_{step}"
        chosen, row, factor = _pivot(ctx, m, hint)
        det = factor if det is None else ctx.emit("multiply", [det, factor], {}, f"{hint}_det")
        if step < n - 1:
            m = _eliminate(ctx, m, chosen, row, hint)
    ctx.alias(node.outputs[0], ctx.reshape(det, tuple(batch), f"{node.name}_det"))


SIGNAL_CONVERTERS: dict[str, Converter] = {
    "DFT": _dft, "STFT": _stft, "MelWeightMatrix": _mel_weight_matrix, "Einsum": _einsum, "Det": _det,
}
