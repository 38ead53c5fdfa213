"""The CPU a kernel is scheduled and compiled for.

The search needs a few facts about the machine (vector width, cores, cache sizes) and
the compiler needs its ``-march``. A ``Target`` holds exactly those facts, detected from
the host or parsed from a TVM-like string (``"llvm -mcpu=skylake-avx512 -num-cores=4"``)
so that schedules tuned elsewhere can name the machine they were tuned for. Anything a
string leaves out is taken from the host. ``Target("cuda ...")`` builds a ``CudaTarget``
instead (target/cuda.py), so one entry point names either kind of machine.
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..errors import TargetError
from .cuda import CudaTarget
from .spec import Fields, check_complete, given_fields, option_names

ISAS = ("avx512", "avx2", "neon", "scalar")
_VECTOR_BYTES = {"avx512": 64, "avx2": 32, "neon": 16, "scalar": 0}
_VECTOR_REGISTERS = {"avx512": 32, "avx2": 16, "neon": 32, "scalar": 16}
# The -march used when a string picks an ISA other than the host's without naming a CPU.
_DEFAULT_MARCH = {"avx512": "skylake-avx512", "avx2": "haswell", "neon": "armv8-a", "scalar": ""}
_MCPU_ISA = {
    **dict.fromkeys(("skylake-avx512", "cascadelake", "icelake-server", "sapphirerapids", "znver4"), "avx512"),
    **dict.fromkeys(("core-avx2", "haswell", "broadwell", "skylake", "znver2", "znver3"), "avx2"),
}
_KINDS = ("llvm", "c", "cpu")  # all mean the CPU, spelled "llvm" as in TVM
_EXAMPLE = "Target('llvm -mcpu=core-avx2 -num-cores=4')"
_FALLBACK_CACHE_BYTES = {1: 32 << 10, 2: 1 << 20, 3: 32 << 20}
_CPU0_CACHE_DIR = Path("/sys/devices/system/cpu/cpu0/cache")
_BFLOAT16_DOT_MARCH = ("sapphirerapids", "znver4", "cooperlake")  # -march values of CPUs with AVX-512 BF16


@dataclass(frozen=True, slots=True, init=False)
class Target(Fields):
    """A CPU target. ``Target(spec=None, **fields)``: ``spec`` is a string, a dict of
    fields, another Target, or None for the host; keyword fields override the spec.

    A spec of kind ``cuda`` (``"cuda -arch=sm_90"``, ``{"kind": "cuda"}``, a ``CudaTarget``)
    gives a ``CudaTarget`` instead, which is not a ``Target``.

    A string is TVM-like: a kind (``llvm``, or its aliases ``c`` and ``cpu``) and options
    ``-name=value`` naming fields (``-num-cores=4``, ``-isa=avx2``) or TVM's ``-mcpu``
    and ``-mtriple``, which set the ISA, vector width and ``-march``. Whatever the spec
    leaves out is taken from the host. ``str(target)`` spells every field, so it names
    the same target on any machine; tuning records store it.

    Args:
        spec: A target string, a dict of fields, a ``Target``, or None for the host.
        **overrides: Fields that replace the spec's.

    Attributes:
        kind: Always ``"llvm"`` (a CPU).
        isa: ``"avx512"``, ``"avx2"``, ``"neon"`` or ``"scalar"``.
        vector_bytes: Bytes in a SIMD register (0 for scalar).
        num_cores: Cores that parallel loops use.
        cache_line_bytes: Bytes in a cache line.
        l1_bytes: L1 data cache bytes.
        l2_bytes: L2 cache bytes.
        l3_bytes: L3 cache bytes.
        march: gcc's ``-march`` (``"native"`` for the host; ``""`` for none).

    Raises:
        TargetError: If the spec is of another type, an option or field is unknown or
            malformed, or the fields disagree (a vector width that does not fit the ISA).

    Example:
        ::

            tc.Target()                                      # this machine
            tc.Target("llvm -mcpu=core-avx2 -num-cores=4")   # a Haswell-class 4-core CPU
            tc.Target(tc.Target.host(), num_cores=1)         # this machine, one core
            tc.Target("cuda -arch=sm_90")                    # an H100: a tc.CudaTarget
    """

    kind: str
    isa: str
    vector_bytes: int
    num_cores: int
    cache_line_bytes: int
    l1_bytes: int
    l2_bytes: int
    l3_bytes: int
    march: str

    def __new__(cls, spec: str | Mapping[str, Any] | Target | CudaTarget | None = None, **overrides: Any) -> Any:
        # A CudaTarget is no Target, so Python then skips Target.__init__.
        if cls is Target and _kind_of(spec, overrides) == "cuda":
            return CudaTarget(spec, **overrides)
        return object.__new__(cls)

    def __init__(self, spec: str | Mapping[str, Any] | Target | None = None, **overrides: Any) -> None:
        given = given_fields(spec, Target, "a target", _EXAMPLE, _STRING_OPTIONS)
        given.update(overrides)
        _set_fields(self, _resolve(given))

    @classmethod
    def host(cls) -> Target:
        """The machine this process runs on (detected once)."""
        return _detect_host()

    @classmethod
    def parse(cls, spec: str | Mapping[str, Any] | Target | None) -> Target:
        """``Target(spec)``, by another name.

        Raises:
            TargetError: As ``Target``.
        """
        return cls(spec)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Target | CudaTarget:
        """The target ``to_json`` wrote (a ``CudaTarget`` for kind ``cuda``).

        Raises:
            TargetError: If a field is missing or invalid.
        """
        if data.get("kind") == "cuda":
            return CudaTarget.from_json(data)
        check_complete(data, Target, "target")
        return cls(data)

    @property
    def has_bfloat16_dot(self) -> bool:
        """Whether the CPU sums two bfloat16 products a lane in one instruction (AVX-512 BF16's
        ``vdpbf16ps``, ``codegen/dot_pairs.py``): a bfloat16 model's products then read bfloat16
        (twice as fast); without it they compute in float32 between casts, where widening each
        element cost 6-9% (``graph/half.CPU_PRODUCTS``)."""
        return _host_has("avx512_bf16") if self.march == "native" else self.march in _BFLOAT16_DOT_MARCH

    def vector_lanes(self, dtype: str, extent: int | None = None) -> int:
        """How many ``dtype`` elements fit in one SIMD register (1 without SIMD); with
        ``extent``, in the vector a loop of that many iterations takes: the register's, or,
        for a shorter loop, the widest half, quarter... that the loop fills, down to 4 lanes
        (a row of 14 floats takes vectors of 8 on AVX-512)."""
        lanes = max(1, self.vector_bytes // np.dtype(dtype).itemsize)
        while extent is not None and lanes > max(extent, 4):
            lanes //= 2
        return lanes

    @property
    def vector_registers(self) -> int:
        """How many SIMD registers the ISA has (general registers without SIMD)."""
        return _VECTOR_REGISTERS.get(self.isa, 16)

    def cflags(self) -> list[str]:
        """gcc flags for a shared library of this target. No -ffast-math: results must
        match NumPy, so libm's exp/tanh and IEEE semantics are kept; only FMA contraction."""
        if self.march == "native" and platform.machine() in ("aarch64", "arm64"):
            arch = ["-mcpu=native"]
        else:
            arch = [f"-march={self.march}"] if self.march else []
        return ["-O3", *arch, "-fopenmp", "-fPIC", "-shared", "-ffp-contract=fast"]


_FIELD_NAMES = tuple(f.name for f in fields(Target))
_INT_FIELDS = ("vector_bytes", "num_cores", "cache_line_bytes", "l1_bytes", "l2_bytes", "l3_bytes")
_STRING_OPTIONS = option_names(Target, ("mcpu", "mtriple"))


def _set_fields(target: Target, values: Mapping[str, Any]) -> None:
    for name in _FIELD_NAMES:
        object.__setattr__(target, name, values[name])


def _kind_of(spec: Any, overrides: Mapping[str, Any]) -> Any:
    """The kind a ``Target(spec, **overrides)`` call names, before anything is checked."""
    if "kind" in overrides:
        return overrides["kind"]
    if isinstance(spec, str):
        return (spec.split() or [""])[0]
    return spec.get("kind") if isinstance(spec, Mapping) else getattr(spec, "kind", None)


def _resolve(given: Mapping[str, Any]) -> dict[str, Any]:
    """Fill what ``given`` leaves out from the host: an ISA picked by -mcpu or -mtriple
    brings its vector width and -march, then explicit fields override."""
    unknown = sorted(set(given) - set(_FIELD_NAMES) - {"mcpu", "mtriple"})
    if unknown:
        raise TargetError(f"unknown target field(s) {', '.join(unknown)}; the fields are {', '.join(_FIELD_NAMES)}")
    host = _detect_host()
    values = host.to_json()
    kind = str(given.get("kind", "llvm"))
    if kind not in _KINDS:
        raise TargetError(f"target kind {kind!r} is unknown; use 'llvm' (or its aliases 'c', 'cpu'), as in {_EXAMPLE}")
    isa, march = _isa_from_mcpu_and_triple(given.get("mcpu"), given.get("mtriple"), host)
    if isa is not None or "isa" in given:
        values["isa"] = isa = given.get("isa", isa)
        values["vector_bytes"] = _VECTOR_BYTES.get(isa, 0)
        if march is None:
            march = host.march if isa == host.isa else _DEFAULT_MARCH.get(isa, "")
        values["march"] = march
    values.update((k, v) for k, v in given.items() if k in _FIELD_NAMES and k != "kind")
    _validate(values)
    return values


def _isa_from_mcpu_and_triple(mcpu: str | None, triple: str | None, host: Target) -> tuple[str | None, str | None]:
    """The ISA and -march implied by TVM's -mcpu / -mtriple (None, None when neither is given)."""
    isa = march = None
    if triple is not None:
        if triple.startswith(("aarch64", "arm64")):
            isa, march = "neon", "armv8-a"
        elif triple.startswith("x86_64"):
            if host.isa == "neon":
                isa, march = "scalar", "x86-64"
        else:
            raise TargetError(f"-mtriple={triple} is not supported; use -mtriple=x86_64-linux-gnu "
                              f"or -mtriple=aarch64-linux-gnu")
    if mcpu is not None:
        if mcpu not in _MCPU_ISA:
            raise TargetError(f"-mcpu={mcpu} is unknown; the known CPUs are {', '.join(_MCPU_ISA)} "
                              f"(or give -isa=... and -march=... directly), as in {_EXAMPLE}")
        if isa == "neon":
            raise TargetError(f"-mcpu={mcpu} is an x86 CPU but -mtriple={triple} is ARM; drop one of them")
        isa, march = _MCPU_ISA[mcpu], mcpu
    return isa, march


def _validate(values: Mapping[str, Any]) -> None:
    isa = values["isa"]
    if isa not in ISAS:
        raise TargetError(f"target isa {isa!r} is unknown; use one of {', '.join(ISAS)}")
    for name in _INT_FIELDS:
        value = values[name]
        least = 0 if name == "vector_bytes" else 1
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise TargetError(f"target {name}={value!r} must be an integer >= {least}, e.g. {name}=4")
    if values["vector_bytes"] not in (0, 16, 32, 64) or (values["vector_bytes"] == 0) != (isa == "scalar"):
        raise TargetError(f"target vector_bytes={values['vector_bytes']} does not fit isa={isa}; use "
                          f"{_VECTOR_BYTES[isa]} (0 means no SIMD and goes only with isa=scalar)")
    march = values["march"]
    if not isinstance(march, str) or any(c.isspace() for c in march) or march.startswith("-"):
        raise TargetError(f"target march={march!r} must be one gcc -march value such as 'native' or 'znver3' "
                          f"(or '' for none)")


@functools.cache
def _host_has(flag: str) -> bool:
    """Whether the host CPU lists ``flag`` (Linux's /proc/cpuinfo); False where it cannot tell."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()  # read and closed: no ResourceWarning
    except OSError:
        return False
    return any(line.startswith("flags") and flag in line.split() for line in lines)


@functools.cache
def _detect_host() -> Target:
    isa = _detect_isa()
    level_bytes, line_bytes = _detect_caches()
    target = object.__new__(Target)
    _set_fields(target, {
        "kind": "llvm", "isa": isa, "vector_bytes": _VECTOR_BYTES[isa], "num_cores": _detect_num_cores(),
        "cache_line_bytes": line_bytes, "l1_bytes": level_bytes[1], "l2_bytes": level_bytes[2],
        "l3_bytes": level_bytes[3], "march": "native",
    })
    return target


def _detect_isa() -> str:
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    return _isa_from_cpuinfo(cpuinfo, platform.machine())


def _isa_from_cpuinfo(cpuinfo: str, machine: str) -> str:
    """The best ISA the feature flags (x86 ``flags``, ARM ``Features``) allow."""
    flags = {flag for line in cpuinfo.splitlines() if line.startswith(("flags", "Features"))
             for flag in line.partition(":")[2].split()}
    if "avx512f" in flags:
        return "avx512"
    if {"avx2", "fma"} <= flags:
        return "avx2"
    if "asimd" in flags or machine in ("aarch64", "arm64"):
        return "neon"
    return "scalar"


def _detect_num_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _detect_caches() -> tuple[dict[int, int], int]:
    """Data/unified cache bytes per level 1-3 of cpu0, and the cache line size."""
    sizes = dict(_FALLBACK_CACHE_BYTES)
    line_bytes = 64
    for index in sorted(_CPU0_CACHE_DIR.glob("index*")):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            size_bytes = _parse_size((index / "size").read_text().strip())
            if level == 1 and kind != "Instruction":
                line_bytes = int((index / "coherency_line_size").read_text())
        except (OSError, ValueError):
            continue
        if level in sizes and kind != "Instruction":
            sizes[level] = size_bytes
    return sizes, line_bytes


def _parse_size(text: str) -> int:
    """``"32K"`` -> 32768, ``"1M"`` -> 1048576, ``"512"`` -> 512."""
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    return int(text[:-1] if scale > 1 else text) * scale
