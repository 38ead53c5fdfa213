"""Converters of ONNX operators: the recurrent layers (RNN, GRU, LSTM).

The sequence length is a static dim, so a layer is unrolled over time at import into the
graph nodes it is made of; no loop or te operator of its own. For each direction:

- the input projection of every step is one product ``X W^T + Wb`` over all the rows of
  ``X`` at once (a ``dense`` when ``W`` is a constant, else a ``matmul``): only the state's
  projection depends on the step before, so only it is computed step by step;
- each step slices its row of the projection and adds ``h R^T + Rb``, then its gates are
  slices of that sum, put through the node's activations (clipped first when ``clip`` is
  given: onnxruntime clips every gate's input, not ``C`` before ``h(C)``);
- RNN: ``h = f(x + h R^T)``. GRU: ``z, r = f(...)``, ``n = g(x_n + r * (h R_n^T + Rb_n))``
  with ``linear_before_reset``, else ``g(x_n + (r * h) R_n^T + Rb_n)``, a second product;
  ``h = n + z (h - n)``. LSTM: ``i, f = f(. + P * c)``, ``f = 1 - i`` with ``input_forget``,
  ``c = f c + i g(.)``, ``o = f(. + P * c)`` with the new ``c``, ``h = o h(c)``.

A reverse direction walks the steps from the last. ``sequence_lens`` must be a constant (a
``RuntimeInputError`` otherwise); where it is shorter than the sequence for some batch
element, the steps past its end hold the state and give zeros in ``Y``, so ``Y_h`` and
``Y_c`` are the states at each sequence's last step (for a reverse direction, the steps
past the end come first and leave the initial state as it is). The masks are constant
``where`` nodes. ``Y``, ``Y_h`` and ``Y_c`` are built only when something reads them.
Activation parameters are taken in order by the activations that use them, as onnxruntime
takes them; a list of activations for one direction serves both of a bidirectional layer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .onnx_importer import Importer, OnnxNode

Converter = Callable[[Importer, OnnxNode], None]
Activation = tuple[str, float | None, float | None]  # the ONNX name, alpha and beta (None: it takes none)

_PARAMETERS = {"Affine": (1.0, 0.0), "LeakyRelu": (0.01, None), "ThresholdedRelu": (1.0, None),
               "ScaledTanh": (1.0, 1.0), "HardSigmoid": (0.2, 0.5), "Elu": (1.0, None), "Softsign": (None, None),
               "Softplus": (None, None), "Relu": (None, None), "Tanh": (None, None), "Sigmoid": (None, None)}
"""The activations the standard allows, with the defaults of their alpha and beta (those of the ONNX operators)."""


@dataclass(frozen=True)
class _Cell:
    """One direction's parameters as each step reads them."""

    hidden: int
    recurrent: tuple[tuple[str, str | None], ...]  # (weight [n * hidden, hidden], bias or None): products of the state
    activations: tuple[Activation, ...]
    clip: float | None
    peepholes: tuple[str, ...]  # LSTM's P as p_i, p_o, p_f; empty without P
    attrs: dict

    def gate(self, ctx: Importer, x: str, k: int, hint: str) -> str:
        """Activation ``k`` of ``x``, clipped first when the node has a ``clip``."""
        if self.clip is not None:
            x = ctx.emit("clip", [x], {"a_min": -self.clip, "a_max": self.clip}, f"{hint}_clip")
        return _activate(ctx, x, self.activations[k], hint)


def _activate(ctx: Importer, x: str, activation: Activation, hint: str) -> str:
    name, alpha, beta = activation
    if name in ("Relu", "Tanh", "Sigmoid"):
        return ctx.emit(name.lower(), [x], {}, hint)
    if name == "Affine":
        scaled = ctx.emit("multiply", [x, ctx.scalar(alpha, x)], {}, f"{hint}_alpha")
        return ctx.emit("add", [scaled, ctx.scalar(beta, x)], {}, hint)
    if name == "ScaledTanh":
        inner = ctx.emit("tanh", [ctx.emit("multiply", [x, ctx.scalar(beta, x)], {}, f"{hint}_beta")], {}, hint)
        return ctx.emit("multiply", [inner, ctx.scalar(alpha, x)], {}, f"{hint}_alpha")
    function = {"LeakyRelu": "leaky_relu", "ThresholdedRelu": "thresholded_relu", "HardSigmoid": "hard_sigmoid"}.get(
        name, name.lower())
    params = {key: value for key, value in (("alpha", alpha), ("beta", beta)) if value is not None}
    return ctx.emit("unary", [x], {"function": function, **params}, hint)


def _activations(node: OnnxNode, defaults: tuple[str, ...], directions: int) -> list[tuple[Activation, ...]]:
    """Each direction's activations, alpha and beta taken in order by the activations that use them."""
    names = [n.decode() if isinstance(n, bytes) else n for n in node.attrs.get("activations", defaults)]
    names = names * directions if len(names) == len(defaults) else names
    if len(names) != len(defaults) * directions:
        raise node.unsupported(f"{len(names)} activations ({len(defaults)} per direction expected)")
    alphas, betas = iter(node.attrs.get("activation_alpha", ())), iter(node.attrs.get("activation_beta", ()))
    chosen = []
    for name in names:
        if name not in _PARAMETERS:
            raise node.unsupported(f"the activation {name}")
        alpha, beta = _PARAMETERS[name]
        chosen.append((name, None if alpha is None else next(alphas, alpha),
                       None if beta is None else next(betas, beta)))
    return [tuple(chosen[d * len(defaults):(d + 1) * len(defaults)]) for d in range(directions)]


def _part(ctx: Importer, x: str, axis: int, begin: int, end: int, hint: str) -> str:
    return ctx.emit("strided_slice", [x], {"begin": (begin,), "end": (end,), "axes": (axis,)}, hint)


def _take(ctx: Importer, x: str, index: int, axis: int, hint: str) -> str:
    """``x[index]`` along ``axis``, that dim dropped."""
    shape = ctx.shape(x)
    return ctx.reshape(_part(ctx, x, axis, index, index + 1, hint), shape[:axis] + shape[axis + 1:], f"{hint}_taken")


def _chunks(ctx: Importer, x: str, size: int, hint: str) -> list[str]:
    """The gates of ``x`` [batch, n * size]: its n column blocks of ``size``."""
    return [_part(ctx, x, 1, k, k + size, f"{hint}_{k // size}") for k in range(0, ctx.shape(x)[1], size)]


def _linear(ctx: Importer, x: str, weight: str, bias: str | None, hint: str) -> str:
    """``x weight^T + bias``: a ``dense`` of a constant weight (packable ahead of time), else a ``matmul``."""
    out = ctx.emit("dense", [x, weight], {}, hint) if weight in ctx.constants else ctx.emit(
        "matmul", [x, weight], {"transpose_b": True}, hint)
    return out if bias is None else ctx.emit("add", [out, bias], {}, f"{hint}_bias")


def _op(ctx: Importer, op: str, *inputs: str, hint: str) -> str:
    return ctx.emit(op, inputs, {}, hint)


def _rnn_step(ctx: Importer, cell: _Cell, x: str, state: tuple[str, ...], hint: str) -> tuple[str, ...]:
    pre = _op(ctx, "add", x, _linear(ctx, state[0], *cell.recurrent[0], f"{hint}_r"), hint=f"{hint}_pre")
    return (cell.gate(ctx, pre, 0, f"{hint}_h"),)


def _gru_step(ctx: Importer, cell: _Cell, x: str, state: tuple[str, ...], hint: str) -> tuple[str, ...]:
    h, = state
    xz, xr, xn = _chunks(ctx, x, cell.hidden, f"{hint}_x")
    hz, hr, *hn = _chunks(ctx, _linear(ctx, h, *cell.recurrent[0], f"{hint}_r"), cell.hidden, f"{hint}_h")
    z, r = (cell.gate(ctx, _op(ctx, "add", a, b, hint=f"{hint}_{k}_pre"), 0, f"{hint}_{k}")
            for k, a, b in (("z", xz, hz), ("r", xr, hr)))
    if cell.attrs.get("linear_before_reset", 0):
        hn = _op(ctx, "multiply", r, hn[0], hint=f"{hint}_reset")
    else:
        hn = _linear(ctx, _op(ctx, "multiply", r, h, hint=f"{hint}_reset"), *cell.recurrent[1], f"{hint}_rn")
    n = cell.gate(ctx, _op(ctx, "add", xn, hn, hint=f"{hint}_n_pre"), 1, f"{hint}_n")
    toward_h = _op(ctx, "multiply", z, _op(ctx, "subtract", h, n, hint=f"{hint}_d"), hint=f"{hint}_zd")
    return (_op(ctx, "add", n, toward_h, hint=f"{hint}_h"),)  # (1 - z) n + z h


def _lstm_step(ctx: Importer, cell: _Cell, x: str, state: tuple[str, ...], hint: str) -> tuple[str, ...]:
    h, c = state
    gates = _op(ctx, "add", x, _linear(ctx, h, *cell.recurrent[0], f"{hint}_r"), hint=f"{hint}_gates")
    i, o, f, g = _chunks(ctx, gates, cell.hidden, hint)

    def peephole(pre: str, k: int, of: str) -> str:
        return _op(ctx, "add", pre, _op(ctx, "multiply", cell.peepholes[k], of, hint=f"{hint}_p{k}"),
                   hint=f"{hint}_peep{k}") if cell.peepholes else pre

    i = cell.gate(ctx, peephole(i, 0, c), 0, f"{hint}_i")
    f = _op(ctx, "subtract", ctx.scalar(1, i), i, hint=f"{hint}_f") if cell.attrs.get("input_forget", 0) else \
        cell.gate(ctx, peephole(f, 2, c), 0, f"{hint}_f")
    c = _op(ctx, "add", _op(ctx, "multiply", f, c, hint=f"{hint}_keep"),
            _op(ctx, "multiply", i, cell.gate(ctx, g, 1, f"{hint}_g"), hint=f"{hint}_new"), hint=f"{hint}_c")
    o = cell.gate(ctx, peephole(o, 1, c), 0, f"{hint}_o")
    return _op(ctx, "multiply", o, _activate(ctx, c, cell.activations[2], f"{hint}_hc"), hint=f"{hint}_h"), c


Step = Callable[[Importer, _Cell, str, tuple[str, ...], str], tuple[str, ...]]
_LAYERS: dict[str, tuple[Step, tuple[str, ...]]] = {  # the step, and the default activations of one direction
    "RNN": (_rnn_step, ("Tanh",)), "GRU": (_gru_step, ("Sigmoid", "Tanh")),
    "LSTM": (_lstm_step, ("Sigmoid", "Tanh", "Tanh"))}


def _cell(ctx: Importer, node: OnnxNode, d: int, activations: tuple[Activation, ...]) -> _Cell:
    hint, hidden = f"{node.name}_d{d}", ctx.shape(node.inputs[2])[-1]
    weight, size = _take(ctx, node.inputs[2], d, 0, f"{hint}_R"), ctx.shape(node.inputs[2])[1]
    bias = _part(ctx, _take(ctx, node.input(3), d, 0, f"{hint}_B"), 0, size, 2 * size, f"{hint}_Rb") \
        if node.input(3) else None
    recurrent = ((weight, bias),)
    if node.op_type == "GRU" and not node.attrs.get("linear_before_reset", 0):  # n's product comes after the reset
        recurrent = tuple((_part(ctx, weight, 0, begin, end, f"{hint}_R{begin}"),
                           bias and _part(ctx, bias, 0, begin, end, f"{hint}_Rb{begin}"))
                          for begin, end in ((0, 2 * hidden), (2 * hidden, 3 * hidden)))
    peepholes = _chunks(ctx, ctx.reshape(_take(ctx, node.input(7), d, 0, f"{hint}_P"), (1, 3 * hidden),
                                         f"{hint}_P2d"), hidden, f"{hint}_P") if node.input(7) else []
    return _Cell(hidden, recurrent, activations, node.attrs.get("clip"), tuple(peepholes), node.attrs)


def _masks(ctx: Importer, node: OnnxNode, steps: int, batch: int) -> list[str | None]:
    """For each step, a constant bool [batch, 1] of the sequences it is within; None where it is within all."""
    lengths = ctx.constant(node, 4, "sequence lengths")
    if lengths is None:
        return [None] * steps
    if lengths.shape != (batch,) or lengths.min() < 1 or lengths.max() > steps:
        raise node.unsupported(f"sequence_lens {lengths.tolist()} (each from 1 to the sequence length {steps})")
    return [None if (lengths > t).all() else ctx.add_constant(
        ctx.fresh_value(f"{node.name}_mask{t}"), (lengths > t).reshape(batch, 1)) for t in range(steps)]


def _run(ctx: Importer, node: OnnxNode, d: int, masks: list[str | None], cell: _Cell) -> tuple[list[str], tuple]:
    """One direction: its ``Y`` in time order, one [batch, hidden] per step, and its last states."""
    layout, x = node.attrs.get("layout", 0), node.inputs[0]
    steps, batch, width = ctx.shape(x)[layout], ctx.shape(x)[1 - layout], ctx.shape(x)[2]
    weight = _take(ctx, node.inputs[1], d, 0, f"{node.name}_d{d}_W")
    bias = _part(ctx, _take(ctx, node.input(3), d, 0, f"{node.name}_d{d}_B"), 0, 0, ctx.shape(weight)[0],
                 f"{node.name}_d{d}_Wb") if node.input(3) else None
    rows = ctx.reshape(x, (steps * batch, width), f"{node.name}_rows")
    rows = _linear(ctx, rows, weight, bias, f"{node.name}_d{d}_x")
    projected = ctx.reshape(rows, (*ctx.shape(x)[:2], ctx.shape(weight)[0]), f"{node.name}_d{d}_x3d")
    state = tuple(_take(ctx, node.input(k), d, layout, f"{node.name}_d{d}_init{k}") if node.input(k) else
                  ctx.add_constant(ctx.fresh_value(f"{node.name}_zeros"), np.zeros((batch, cell.hidden),
                                                                                   ctx.values[x].dtype))
                  for k in ((5, 6) if node.op_type == "LSTM" else (5,)))
    outputs = [""] * steps
    reverse = d == 1 or node.attrs.get("direction", "forward") == "reverse"
    for t in reversed(range(steps)) if reverse else range(steps):
        hint = f"{node.name}_d{d}_t{t}"
        new = _LAYERS[node.op_type][0](ctx, cell, _take(ctx, projected, t, layout, f"{hint}_x"), state, hint)
        outputs[t], state = (new[0], new) if masks[t] is None else (
            ctx.emit("where", [masks[t], new[0], ctx.scalar(0, new[0])], {}, f"{hint}_y"),
            tuple(ctx.emit("where", [masks[t], a, b], {}, f"{hint}_held") for a, b in zip(new, state)))
    return outputs, state


def _joined(ctx: Importer, parts: list[str], shape: tuple[int, ...], axis: int, hint: str) -> str:
    """``parts`` reshaped to ``shape`` and concatenated along ``axis``."""
    parts = [ctx.reshape(p, shape, f"{hint}_part") for p in parts]
    return parts[0] if len(parts) == 1 else ctx.emit("concat", parts, {"axis": axis}, hint)


def _recurrent(ctx: Importer, node: OnnxNode) -> None:
    direction, layout = node.attrs.get("direction", "forward"), node.attrs.get("layout", 0)
    if direction not in ("forward", "reverse", "bidirectional"):
        raise node.unsupported(f"direction {direction}")
    count = 2 if direction == "bidirectional" else 1
    steps, batch = ctx.shape(node.inputs[0])[layout], ctx.shape(node.inputs[0])[1 - layout]
    masks = _masks(ctx, node, steps, batch)
    runs = [_run(ctx, node, d, masks, _cell(ctx, node, d, activations)) for d, activations in
            enumerate(_activations(node, _LAYERS[node.op_type][1], count))]
    hidden = ctx.shape(node.inputs[2])[-1]
    y, *states = (*node.outputs, "", "")[:3]
    if y and y in ctx.read:
        step_shape = (1, 1, batch, hidden) if layout == 0 else (batch, 1, 1, hidden)
        ys = [_joined(ctx, ys, step_shape, layout, f"{node.name}_d{d}_Y") for d, (ys, _) in enumerate(runs)]
        ctx.alias(y, _joined(ctx, ys, ctx.shape(ys[0]), 1 + layout, f"{node.name}_Y"))
    for k, output in enumerate(states):
        if output and output in ctx.read:
            shape = (1, batch, hidden) if layout == 0 else (batch, 1, hidden)
            ctx.alias(output, _joined(ctx, [last[k] for _, last in runs], shape, layout, f"{node.name}_{output}"))


RECURRENT_CONVERTERS: dict[str, Converter] = {"RNN": _recurrent, "GRU": _recurrent, "LSTM": _recurrent}
