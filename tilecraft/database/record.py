"""One measurement as one JSON line: the ``TuningRecord`` and its codec.

A record holds everything needed to use a measurement without the process that made it:
which computation (``workload_key``, and for a registered workload the function name and
arguments that rebuild it), which machine (the canonical target string), the schedule
(the trace JSON with every sampling decision), the outcome (costs in seconds, or an error
kind and message) and the workload's FLOP count, so throughput is known without
rebuilding the DAG.

It also says how it was measured: ``phase`` is ``"search"`` for a measurement that guided
the search, ``"final"`` for a re-measurement of the best candidates when tuning ends
(several interleaved repeats in a fresh worker: the costs that rank schedules, see
``best.py``), ``"model"`` for the kernel a choice in place kept, timed inside a compiled
model between the model's other kernels, and ``"model_rival"`` for one timed beside it there
and not kept (``model/in_place.py``); ``device`` names the machine or device that measured
it. A line looks like this (the trace shortened)::

    {"v":4,"key":"[\\"dag\\", \\"3a35...\\"]","target":"llvm -isa=avx2 ...","workload":null,
     "sketch":"multi_level_tiling","phase":"search","costs":[0.00123,0.00121],"error":"none",
     "error_msg":"","all_cost":0.41,"time":1718000000.5,"flop":2147483648.0,
     "device":"local@build-7","trace":[{"kind":"get_block",...}]}

``v`` is ``RECORD_VERSION``. A reader refuses records newer than itself (it cannot know
what changed) and says to upgrade; it never guesses. It reads every older version:
version 1 had no ``phase`` (every record was a search measurement) and no ``device``;
version 2 had no ``"model"`` phase; version 3 had no ``"model_rival"`` phase: every schedule a
choice in place timed got a ``"model"`` record, and the fastest of them by its median ranked
first.
JSON has no infinity, so a non-finite cost is written as ``null`` and read back as ``inf``.

The trace is most of a line (kilobytes, against a few hundred bytes for the rest) and
most readers never look at it: finding the best of 100,000 records needs only the
costs. So the trace is always written last, and ``from_json_line`` decodes only the part
before it, keeping the trace as its JSON text (``trace_json``); ``record.trace`` decodes
it on use. That text, compact, is also the trace's identity (``trace_key``): two
candidates with equal text are the same schedule, and one is never measured twice.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from typing import Any, Mapping

from ..errors import TilecraftError

RECORD_VERSION = 4
NO_ERROR = "none"
PHASES = ("search", "final", "model", "model_rival")
# How a line that to_json_line wrote starts, in this version and the older ones, whose
# layouts agree up to the trace: the fast readers find a workload's lines by these bytes.
LINE_STARTS = tuple(f'{{"v":{version},"key":' for version in range(RECORD_VERSION, 0, -1))
_TRACE_MARK = ',"trace":['  # the trace is the last field of a line written by to_json_line
_DECODER = json.JSONDecoder()


class RecordFormatError(TilecraftError, ValueError):
    """A tuning record (or a line of a log) cannot be read."""


class RecordVersionError(RecordFormatError):
    """A record was written by a newer tilecraft, with a format this one does not know."""


@dataclass(frozen=True, slots=True)
class TuningRecord:
    """One measured schedule candidate of one workload on one target.

    ``costs`` are the repeated run times in seconds; they mean something only when
    ``error_kind`` is ``"none"``. ``error_kind`` is one of the measure error kinds
    (``"compile"``, ``"run_timeout"``, ...), ``error_msg`` says what happened.
    ``all_cost`` is the wall time the whole measurement took (build and run), ``timestamp``
    when it finished (seconds since the epoch). ``trace_json`` is the trace's step list
    as compact JSON (``trace_key``); ``trace`` decodes it. ``phase`` is ``"search"``,
    ``"final"`` (a re-measurement when tuning ends), ``"model"`` (timed in place inside a
    compiled model, and kept there) or ``"model_rival"`` (timed there, not kept); ``device``
    the machine or device that measured it (None when not known, as in version 1).
    ``version`` is the version the record was read from; it is always written in the
    current one.
    """

    workload_key: str
    workload: dict | None
    target: str
    trace_json: str
    costs: tuple[float, ...]
    error_kind: str
    error_msg: str
    all_cost: float
    timestamp: float
    flop: float
    sketch: str | None
    phase: str = "search"
    device: str | None = None
    version: int = RECORD_VERSION

    @property
    def trace(self) -> list:
        """The trace's steps, as ``Trace.to_json()`` gives them (``Trace.from_json`` reads them)."""
        try:
            steps = json.loads(self.trace_json)
        except ValueError as error:
            raise RecordFormatError(f"the trace of this record is not valid JSON ({error})") from None
        if not isinstance(steps, list):
            raise RecordFormatError(f"the trace of this record should be a list of steps, not {type(steps).__name__}")
        return steps

    @property
    def is_valid(self) -> bool:
        """Measured without error, with at least one finite cost."""
        return self.error_kind == NO_ERROR and bool(self.costs) and all(map(math.isfinite, self.costs))

    @property
    def mean_cost(self) -> float:
        """Mean run time in seconds; ``inf`` for a record that is not valid."""
        return sum(self.costs) / len(self.costs) if self.is_valid else math.inf

    @property
    def cost(self) -> float:
        """The seconds a call takes by the ranking rule (``best.py``): the median of the repeats
        of a final or model record, the mean of a search record's costs; ``inf`` when not valid."""
        if self.phase == "search" or not self.is_valid:
            return self.mean_cost
        return statistics.median(self.costs)

    @property
    def gflops(self) -> float:
        """Throughput at ``cost``; 0.0 for a record that is not valid."""
        cost = self.cost
        return self.flop / cost / 1e9 if 0.0 < cost < math.inf else 0.0

    def to_json(self) -> dict[str, Any]:
        """The record as a JSON-ready dict, the trace decoded (``from_json`` reads it)."""
        return {**self._head(), "trace": self.trace}

    def to_json_line(self) -> str:
        """The record as one compact line of ASCII JSON, trace last, without the newline."""
        head = json.dumps(self._head(), separators=(",", ":"), allow_nan=False)
        trace = self.trace_json if "\n" not in self.trace_json else trace_key(self.trace)  # one line, always
        return f'{head[:-1]},"trace":{trace}}}'

    def _head(self) -> dict[str, Any]:
        return {
            "v": RECORD_VERSION,
            "key": self.workload_key,
            "target": self.target,
            "workload": self.workload,
            "sketch": self.sketch,
            "phase": self.phase,  # just before the costs: a fast reader sees both at once (database.py)
            "costs": [_finite_or_none(c) for c in self.costs],
            "error": self.error_kind,
            "error_msg": self.error_msg,
            "all_cost": _finite_or_none(self.all_cost),
            "time": self.timestamp,
            "flop": self.flop,
            "device": self.device,
        }

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> TuningRecord:
        """Decode ``to_json``'s dict. Raises ``RecordVersionError`` for a newer format and
        ``RecordFormatError`` naming the field that is missing or has the wrong type."""
        if not isinstance(data, Mapping):
            raise RecordFormatError(f"a record must be a JSON object, not {type(data).__name__}")
        _check_version(data)
        if "trace" not in data:
            raise RecordFormatError("record has no field 'trace'")
        if not isinstance(data["trace"], list):
            raise RecordFormatError(_describe_bad_field(data))
        return TuningRecord.from_json_parts(data, trace_key(data["trace"]))

    @staticmethod
    def from_json_line(line: str) -> TuningRecord:
        """Decode one line of a log (the trace is kept as text, see the module docstring).

        Raises:
            RecordVersionError: If the record was written by a newer tilecraft.
            RecordFormatError: If the line is not JSON or a field is missing or mistyped.
        """
        parts = split_line(line)
        if parts is not None:
            try:
                head = _DECODER.raw_decode(parts[0])[0]
            except ValueError:
                head = None  # the mark was inside another field: read the whole line below
            if type(head) is dict and "trace" not in head:
                return TuningRecord.from_json_parts(head, parts[1])
        try:
            data = json.loads(line)
        except ValueError as error:
            raise RecordFormatError(_why_not_json(line, error)) from None
        return TuningRecord.from_json(data)

    @staticmethod
    def from_json_parts(data: Mapping[str, Any], trace_json: str) -> TuningRecord:
        """Decode a line's fields other than the trace, with the trace's text (``split_line``)."""
        # Run for every line of a log: the checks are the few that keep a wrong record out.
        version = data.get("v")
        if type(version) is not int or not 1 <= version <= RECORD_VERSION:  # 1: no phase (search), no device
            _check_version(data)
            raise RecordFormatError(_describe_bad_field(data))
        try:
            key, target, error_kind, costs = data["key"], data["target"], data["error"], data["costs"]
            all_cost = data.get("all_cost")
            record = TuningRecord(
                workload_key=key,
                workload=data.get("workload"),
                target=target,
                trace_json=trace_json,
                costs=_to_costs(costs),
                error_kind=error_kind,
                error_msg=data.get("error_msg", ""),
                all_cost=math.inf if all_cost is None else float(all_cost),
                timestamp=float(data["time"]),
                flop=float(data["flop"]),
                sketch=data.get("sketch"),
                phase=data.get("phase", "search"),
                device=data.get("device"),
                version=version,
            )
        except KeyError as error:
            raise RecordFormatError(f"record has no field {error.args[0]!r}") from None
        except (TypeError, ValueError):
            raise RecordFormatError(_describe_bad_field(data)) from None
        if not (type(key) is str and type(target) is str and type(error_kind) is str and type(costs) is list
                and type(record.error_msg) is str and (record.workload is None or type(record.workload) is dict)
                and (record.sketch is None or type(record.sketch) is str) and record.phase in PHASES
                and (record.device is None or type(record.device) is str)):
            raise RecordFormatError(_describe_bad_field(data))
        return record

    @staticmethod
    def from_measurement(task: Any, measure_input: Any, result: Any, sketch: Any = None,
                         flop: float | None = None) -> TuningRecord:
        """The record of one ``MeasureResult`` of one ``MeasureInput`` of ``task`` (duck-typed:
        a task has ``workload_key``, ``workload``, ``target`` and ``compute_dag``; ``sketch``
        is a sketch or its name; ``result.phase`` and ``result.device``, when it has them, say
        how it was measured)."""
        error_kind = getattr(result.error_kind, "value", result.error_kind)
        return TuningRecord(
            workload_key=task.workload_key,
            workload=task.workload,
            target=str(task.target),
            trace_json=trace_key(measure_input.trace),
            costs=tuple(float(c) for c in result.costs),
            error_kind=str(error_kind),
            error_msg=str(result.error_msg),
            all_cost=float(result.all_cost),
            timestamp=float(result.timestamp),
            flop=float(task.compute_dag.flop_count() if flop is None else flop),
            sketch=None if sketch is None else str(getattr(sketch, "name", sketch)),
            phase=getattr(result, "phase", "search"),
            device=getattr(result, "device", None),
        )


def split_line(line: str) -> tuple[str, str] | None:
    """A line as ``to_json_line`` writes it (with its newline), cut into the JSON object of
    every field but the trace, and the trace's JSON text; None for any other layout."""
    cut = line.find(_TRACE_MARK) if line.endswith("]}\n") else -1
    if cut < 1:
        return None
    return line[:cut] + "}", line[cut + len(_TRACE_MARK) - 1:-2]


def trace_key(trace: Any) -> str:
    """The identity of a schedule: its trace (a ``Trace`` or its JSON list) as compact JSON."""
    steps = trace.to_json() if hasattr(trace, "to_json") else trace
    return json.dumps(steps, separators=(",", ":"))


def workload_label(workload_key: str, workload: Mapping[str, Any] | None) -> str:
    """``matmul(1024, 1024, 1024)`` for a registered workload, else the key itself."""
    if not workload:
        return workload_key
    args = ", ".join(json.dumps(a) if isinstance(a, str) else repr(a) for a in workload.get("args", ()))
    return f"{workload.get('func', '?')}({args})"


def _check_version(data: Mapping[str, Any]) -> None:
    version = data.get("v")
    if type(version) is int and version > RECORD_VERSION:
        raise RecordVersionError(
            f"record version {version} is newer than this tilecraft reads (up to version "
            f"{RECORD_VERSION}); upgrade tilecraft to read it")


_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "v": (int,), "key": (str,), "target": (str,), "workload": (dict, type(None)),
    "sketch": (str, type(None)), "costs": (list,), "error": (str,), "error_msg": (str,),
    "all_cost": (int, float, type(None)), "time": (int, float), "flop": (int, float), "phase": (str,),
    "device": (str, type(None)), "trace": (list,),
}
_OPTIONAL_FIELDS = ("workload", "sketch", "error_msg", "all_cost", "phase", "device", "trace")


def _describe_bad_field(data: Mapping[str, Any]) -> str:
    """Which field makes ``data`` unreadable (the slow path, only for bad records)."""
    for name, types in _FIELD_TYPES.items():
        if name not in data:
            if name in _OPTIONAL_FIELDS:
                continue
            return f"record has no field {name!r}"
        value = data[name]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            expected = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            return f"record field {name!r} should be {expected}, not {json.dumps(value)[:60]}"
    if data["v"] < 1:
        return f"record field 'v' should be a version number from 1, not {data['v']}"
    if data.get("phase", "search") not in PHASES:
        return f"record field 'phase' should be one of {', '.join(PHASES)}, not {json.dumps(data['phase'])[:60]}"
    bad = [c for c in data["costs"] if not isinstance(c, (int, float, type(None))) or isinstance(c, bool)]
    if bad:
        return f"record field 'costs' should hold numbers, not {json.dumps(bad[0])[:60]}"
    return "record has a field of the wrong type"


def _why_not_json(line: str, error: ValueError) -> str:
    if not isinstance(error, json.JSONDecodeError):
        return f"not valid JSON ({error})"
    reason = f"not valid JSON ({error.msg} at column {error.colno})"
    if error.pos >= len(line.rstrip()):
        reason += "; it ends early, as when a tuning run is killed while writing"
    return reason


def _to_costs(costs: list) -> tuple[float, ...]:
    try:
        return tuple(map(float, costs))
    except TypeError:  # null stands for a cost that was not finite
        return tuple(math.inf if c is None else float(c) for c in costs)


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None
