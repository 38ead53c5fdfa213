"""What the CPU and the CUDA target share: how a spec becomes fields, and fields a string.

A target is given as a string (``"llvm -num-cores=4"``, ``"cuda -arch=sm_90"``), a dict of
fields, another target of its kind, or None; ``str(target)`` spells every field so that it
names the same machine anywhere, and ``to_json`` gives them by name. Each kind keeps its
own options, facts and checks (``cpu.py``, ``cuda.py``); this module keeps the one way of
reading and writing them.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Collection, Mapping

from ..errors import TargetError


class Fields:
    """``__str__`` and ``to_json`` of a frozen target dataclass (slots: no state of its own)."""

    __slots__ = ()

    def __str__(self) -> str:
        """A canonical string: the target of ``str(t)`` equals ``t`` on any machine."""
        return " ".join([self.kind] + [f"-{f.name.replace('_', '-')}={getattr(self, f.name)}"
                                       for f in fields(self) if f.name != "kind"])

    def to_json(self) -> dict[str, Any]:
        """Every field by name, as ``from_json`` reads them."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def given_fields(spec: Any, kind: type, what: str, example: str, options: Mapping[str, str],
                 int_example: str | None = None) -> dict[str, Any]:
    """The fields a spec names: a string's ``options`` (``parse_options``), a dict, a target
    of ``kind``'s fields, or none.

    Raises:
        TargetError: If ``spec`` is of another type, or a string's option is not understood.
    """
    if spec is None:
        return {}
    if isinstance(spec, kind):
        return spec.to_json()
    if isinstance(spec, str):
        return parse_options(spec, options, int_fields(kind), example, int_example)
    if isinstance(spec, Mapping):
        return dict(spec)
    raise TargetError(f"{what} must be a string, a dict or a {kind.__name__}, not {type(spec).__name__}; "
                      f"for example {example}")


def option_names(kind: type, extra: Collection[str] = ()) -> dict[str, str]:
    """``-field-name`` -> field, for every field of ``kind`` but its kind, and ``extra`` names."""
    names = [f.name for f in fields(kind) if f.name != "kind"] + list(extra)
    return {f"-{name.replace('_', '-')}": name for name in names}


def parse_options(spec: str, options: Mapping[str, str], int_fields: Collection[str], example: str,
                  int_example: str | None = None) -> dict[str, Any]:
    """``"llvm -mcpu=x --num-cores=4"`` -> ``{"kind": "llvm", "mcpu": "x", "num_cores": 4}``.

    Raises:
        TargetError: If an option is unknown, has no value, is given twice, or is not an
            integer where ``int_fields`` says it must be.
    """
    kind, *words = spec.split() or [""]
    given: dict[str, Any] = {"kind": kind}
    for option in words:
        name, eq, value = option.partition("=")
        key = options.get(name[1:] if name.startswith("--") else name)
        if key is None or not eq:
            raise TargetError(f"target {spec!r}: option {option!r} is not understood; the options are "
                              f"{', '.join(k + '=...' for k in options)}, as in {example}")
        if key in given:
            raise TargetError(f"target {spec!r} sets {name} twice; keep one")
        if key not in int_fields:
            given[key] = value
            continue
        try:
            given[key] = int(value)
        except ValueError:
            raise TargetError(f"target {spec!r}: {name}={value!r} is not an integer; "
                              f"write e.g. {int_example or name + '=4'} as in {example}") from None
    return given


def check_complete(data: Mapping[str, Any], kind: type, what: str) -> None:
    """Raise ``TargetError`` unless ``data`` (from ``to_json``) names every field of ``kind``."""
    missing = [f.name for f in fields(kind) if f.name not in data]
    if missing:
        raise TargetError(f"{what} JSON lacks {', '.join(missing)}; write it with {kind.__name__}.to_json()")


def int_fields(kind: type) -> set[str]:
    """The fields of ``kind`` that hold integers (a string's values for them are parsed)."""
    return {f.name for f in fields(kind) if f.type in ("int", int)}
