"""Traces: the record of every primitive applied to a schedule, with sampling decisions.

A ``Step`` is one call of a public ``Schedule`` method: its name, its keyword arguments
(random-variable references stand for blocks, loops and sampled values), the symbols of
what it returned, and, for a sampling step, the decision taken. Replaying a trace calls
the same methods again on a fresh schedule, so a trace is as expressive as the API;
with other decisions it gives another candidate of the same sketch, deterministically.

Traces are stored as JSON (never pickle) and print as runnable Python.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ..errors import ScheduleError

SAMPLING_STEPS = ("sample_perfect_tile", "sample_tile", "sample_categorical", "sample_compute_location")
VARIADIC_STEPS = ("fuse", "reorder")  # take their loops positionally: sch.fuse(l1, l2)


@dataclass(frozen=True, slots=True)
class RVRef:
    """A reference to a block, loop or sampled value by its symbol (``b0``, ``l3``, ``v5``)."""

    symbol: str


@dataclass(frozen=True, slots=True)
class IndexMap:
    """A layout map ``lambda *source: targets`` held as expressions, so it stores as JSON."""

    params: tuple[str, ...]
    targets: tuple[Any, ...]  # expression trees in the JSON form of ``index_expr_to_json``

    def __call__(self, *indices):
        from .index_expr import index_expr_from_json

        variables = {name: idx for name, idx in zip(self.params, indices)}
        return tuple(index_expr_from_json(t, variables) for t in self.targets)

    def to_python(self) -> str:
        from .index_expr import index_expr_to_python

        body = ", ".join(index_expr_to_python(t) for t in self.targets)
        return f"lambda {', '.join(self.params)}: ({body}{',' if len(self.targets) == 1 else ''})"


@dataclass(frozen=True, slots=True)
class Step:
    """One call of a public ``Schedule`` method.

    Attributes:
        kind: The method's name (``"split"``, ``"sample_perfect_tile"``, ...).
        args: Its keyword arguments as ``(name, value)`` pairs; blocks, loops and sampled
            values are given by ``RVRef``, a reference to their symbol.
        outputs: The symbols of what it returned, in order.
        decision: For a sampling step, the decision taken; None otherwise.
    """

    kind: str
    args: tuple[tuple[str, Any], ...]
    outputs: tuple[str, ...] = ()
    decision: Any = None

    @property
    def is_sampling(self) -> bool:
        """Whether the step samples (and so has a decision a replay may change)."""
        return self.kind in SAMPLING_STEPS

    def to_json(self) -> dict:
        """The step as a JSON-ready dict: ``kind``, ``args``, and ``outputs`` and ``decision``
        when it has them."""
        record: dict[str, Any] = {"kind": self.kind, "args": {k: _encode(v) for k, v in self.args}}
        if self.outputs:
            record["outputs"] = list(self.outputs)
        if self.decision is not None:
            record["decision"] = self.decision
        return record

    @staticmethod
    def from_json(record: Mapping) -> Step:
        """The step that ``to_json`` wrote.

        Raises:
            ScheduleError: If ``record`` is not a step in that form.
        """
        try:
            args = tuple((k, _decode(v)) for k, v in record["args"].items())
            decision = record.get("decision")
            if isinstance(decision, list):
                decision = tuple(decision)
            return Step(record["kind"], args, tuple(record.get("outputs", ())), decision)
        except (KeyError, TypeError, AttributeError) as error:
            raise ScheduleError(f"malformed trace step {record!r}: {error}") from None

    def to_python(self) -> str:
        """The step as one line of Python on a schedule ``sch``, e.g.
        ``l4, l5 = sch.split(loop=l1, factors=[None, 16])``."""
        args = ([_python_value(v) for v in dict(self.args)["loops"]] if self.kind in VARIADIC_STEPS
                else [f"{k}={_python_value(v)}" for k, v in self.args])
        if self.decision is not None:
            args.append(f"decision={_python_value(self.decision)}")
        call = f"sch.{self.kind}({', '.join(args)})"
        if not self.outputs:
            return call
        if self.kind in ("get_loops", "split", "sample_perfect_tile", "sample_tile"):
            return f"{', '.join(self.outputs)}{',' if len(self.outputs) == 1 else ''} = {call}"
        return f"{self.outputs[0]} = {call}"


@dataclass(frozen=True, slots=True)
class Trace:
    """The steps that made a schedule, with their sampling decisions; immutable.

    A trace is how tilecraft stores, prints and reproduces a schedule: ``to_json`` and
    ``from_json`` round-trip it (a tuning record holds one), ``to_python`` prints it as a
    function of a schedule, and ``replay`` applies it to a fresh schedule of a DAG, with
    other decisions when given, which is how a search turns a candidate into a schedule.

    Attributes:
        steps: The steps, in the order they were applied.

    Example:
        Store a schedule's trace and rebuild the schedule from it::

            text = sch.trace.dumps()
            again = tc.Trace.from_json(text).replay(dag)
            print(again.trace.to_python())
    """

    steps: tuple[Step, ...] = field(default_factory=tuple)

    @property
    def decisions(self) -> dict[int, Any]:
        """Decision of every sampling step, keyed by the step's index."""
        return {n: s.decision for n, s in enumerate(self.steps) if s.is_sampling}

    def with_decisions(self, decisions: Mapping[int, Any]) -> Trace:
        """A copy of the trace with the decisions of some sampling steps replaced.

        Args:
            decisions: New decisions keyed by step index (as ``decisions`` gives them).

        Raises:
            ScheduleError: If an index is that of a step that does not sample.
        """
        steps = list(self.steps)
        for index, decision in decisions.items():
            if not steps[index].is_sampling:
                raise ScheduleError(f"step {index} ({steps[index].kind}) is not a sampling step; it has no decision")
            steps[index] = Step(steps[index].kind, steps[index].args, steps[index].outputs,
                                tuple(decision) if isinstance(decision, list) else decision)
        return Trace(tuple(steps))

    def replay(self, dag, decisions: Mapping[int, Any] | None = None, seed: int | None = None,
               observe: Callable[[Any, int, Step, dict, Any], None] | None = None):
        """Apply the steps to a fresh schedule of ``dag``.

        Args:
            dag: The ``ComputeDAG`` (or its tensors) the trace was made on, or one with the
                same blocks and loops.
            decisions: Decisions keyed by step index that override the recorded ones.
            seed: Seed of the new schedule's generator, for sampling steps with no decision.
            observe: Called as ``observe(sch, index, step, kwargs, result)`` after each step.

        Returns:
            The new ``Schedule``; its trace equals this one with the decisions applied.

        Raises:
            ScheduleError: If a step cannot be applied (a decision invalid for this DAG, a
                missing block) or refers to a symbol no earlier step defined.
        """
        from .schedule import Schedule

        trace = self.with_decisions(decisions or {})
        sch = Schedule(dag, seed=seed)
        symbols: dict[str, Any] = {}
        for index, step in enumerate(trace.steps):
            kwargs = {k: _resolve(v, symbols) for k, v in step.args}
            if step.is_sampling and step.decision is not None:
                kwargs["decision"] = list(step.decision) if isinstance(step.decision, tuple) else step.decision
            result = (getattr(sch, step.kind)(*kwargs["loops"]) if step.kind in VARIADIC_STEPS
                      else getattr(sch, step.kind)(**kwargs))
            results = list(result) if isinstance(result, (list, tuple)) else [result]
            for symbol, value in zip(step.outputs, results):
                symbols[symbol] = value
            if observe is not None:
                observe(sch, index, step, kwargs, result)
        return sch

    def to_json(self) -> list[dict]:
        """The steps as a JSON-ready list of dicts (``Step.to_json``)."""
        return [step.to_json() for step in self.steps]

    def dumps(self) -> str:
        """The trace as compact JSON text, which ``from_json`` reads."""
        return json.dumps(self.to_json(), separators=(",", ":"))

    @staticmethod
    def from_json(records: list | str) -> Trace:
        """The trace that ``to_json`` (a list) or ``dumps`` (a string) wrote.

        Raises:
            ScheduleError: If a step is malformed.
            json.JSONDecodeError: If a string is not JSON.
        """
        if isinstance(records, str):
            records = json.loads(records)
        return Trace(tuple(Step.from_json(r) for r in records))

    def to_python(self, name: str = "apply_trace") -> str:
        """The trace as the source of a Python function ``name(sch)`` that applies the steps,
        sampling steps with their decisions."""
        lines = [f"def {name}(sch):"]
        lines += [f"    {step.to_python()}" for step in self.steps] or ["    pass"]
        return "\n".join(lines)

    def show(self) -> None:
        """Print ``to_python()``, as TVM's ``Trace.show``."""
        print(self.to_python())

    def __str__(self) -> str:
        return self.to_python()


def _encode(value: Any) -> Any:
    if isinstance(value, RVRef):
        return {"$rv": value.symbol}
    if isinstance(value, IndexMap):
        return {"$index_map": {"params": list(value.params), "targets": list(value.targets)}}
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if "$rv" in value:
            return RVRef(value["$rv"])
        if "$index_map" in value:
            body = value["$index_map"]
            return IndexMap(tuple(body["params"]), tuple(_freeze(t) for t in body["targets"]))
        raise ScheduleError(f"unknown value {value!r} in a trace step")
    if isinstance(value, list):
        return tuple(_decode(v) for v in value)
    return value


def _freeze(value: Any) -> Any:
    return tuple(_freeze(v) for v in value) if isinstance(value, list) else value


def _resolve(value: Any, symbols: dict[str, Any]) -> Any:
    if isinstance(value, RVRef):
        if value.symbol not in symbols:
            raise ScheduleError(f"trace refers to {value.symbol} before any step defines it")
        return symbols[value.symbol]
    if isinstance(value, tuple):
        return [_resolve(v, symbols) for v in value]
    return value


def _python_value(value: Any) -> str:
    if isinstance(value, RVRef):
        return value.symbol
    if isinstance(value, IndexMap):
        return value.to_python()
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_python_value(v) for v in value) + "]"
    return repr(value)
