"""The NVIDIA GPU a kernel is scheduled and compiled for.

A GPU schedule is bounded by the device's limits (threads and shared memory per block,
registers) and sized by its SM count and L2, and nvcc needs its ``-arch``. A
``CudaTarget`` holds exactly those facts, read from GPU 0 through ``cuda-bindings`` or
taken from a small table per architecture, and parsed from a TVM-like string
(``"cuda -arch=sm_80 -sm-count=108"``) so that records name the GPU they were tuned for.
``Target("cuda ...")`` builds one too (target/cpu.py dispatches on the kind).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, fields
from typing import Any, Mapping

from ..errors import TargetError
from .spec import Fields, check_complete, given_fields, option_names

# Facts that differ per architecture, for one representative part each:
# (SMs, opt-in shared memory bytes per block, L2 bytes). The opt-in limits are the CUDA
# programming guide's "maximum amount of shared memory per thread block" per compute
# capability; SM counts and L2 sizes are the named part's (other parts of the same
# architecture differ, so a string or the detected device overrides them).
_ARCHS = {
    "sm_70": (80, 96 << 10, 6 << 20),  # V100 SXM2
    "sm_75": (40, 64 << 10, 4 << 20),  # T4
    "sm_80": (108, 163 << 10, 40 << 20),  # A100
    "sm_86": (72, 99 << 10, 6 << 20),  # A10 (an RTX 3090 has 82 SMs)
    "sm_89": (58, 99 << 10, 48 << 20),  # L4 (an RTX 4090 has 128 SMs and 72 MiB of L2)
    "sm_90": (132, 227 << 10, 50 << 20),  # H100 SXM (the PCIe part has 114 SMs)
}
# Facts every architecture in the table shares. 48 KiB is the static shared memory limit;
# more needs dynamic shared memory and the opt-in attribute. max_vthread and
# max_vector_bytes are the schedule's choices (TVM's defaults), not the device's.
_COMMON = {"warp_size": 32, "max_threads_per_block": 1024, "max_shared_memory_per_block": 48 << 10,
           "registers_per_block": 64 << 10, "max_registers_per_thread": 255, "max_vthread": 8,
           "max_vector_bytes": 16}
TENSOR_CORE_TILE = 16  # the rows, columns and reduction of a tensor core's tile (wmma's m16n16k16)
_FALLBACK_ARCH = "sm_90"  # CI has no GPU and compiles for sm_90
_ARCH_PATTERN = re.compile(r"sm_\d\d+a?")
_EXAMPLE = "CudaTarget('cuda -arch=sm_80 -sm-count=108')"
_INSTALL = "pip install -e '.[cuda]'"


@dataclass(frozen=True, slots=True, init=False)
class CudaTarget(Fields):
    """An NVIDIA GPU. ``CudaTarget(spec=None, **fields)``: ``spec`` is a string, a dict of
    fields, another CudaTarget, or None for GPU 0; keyword fields override the spec.

    A string is TVM-like: the kind ``cuda`` and options ``-field-name=value``
    (``-arch=sm_80``, ``-sm-count=108``). An ``-arch`` brings its table's facts; with none,
    the facts are read from GPU 0, or are sm_90's where no GPU or no ``cuda-bindings`` is
    found (CI compiles for sm_90 without a GPU). Options override either. ``str(target)``
    spells every field, so it names the same GPU on any machine.

    Args:
        spec: A target string, a dict of fields, a ``CudaTarget``, or None for GPU 0.
        **overrides: Fields that replace the spec's.

    Attributes:
        kind: Always ``"cuda"``.
        arch: nvcc's architecture, ``"sm_90"`` (or ``"sm_90a"`` for Hopper-only features).
        sm_count: Streaming multiprocessors.
        warp_size: Threads in a warp.
        max_threads_per_block: Threads a block may have.
        max_shared_memory_per_block: Shared memory bytes a block gets without opting in.
        max_shared_memory_per_block_optin: Shared memory bytes a block may opt in to.
        registers_per_block: 32-bit registers a block may use.
        max_registers_per_thread: 32-bit registers a thread may use.
        l2_bytes: L2 cache bytes.
        max_vthread: Virtual threads a schedule may bind (TVM's ``vthread``).
        max_vector_bytes: Bytes one vectorized load or store may move.

    Raises:
        TargetError: If the spec is of another type or kind, the arch is unknown, an
            option or field is unknown, or a value is not a positive integer.

    Example:
        ::

            tc.CudaTarget()                                  # GPU 0, or sm_90 without one
            tc.CudaTarget("cuda -arch=sm_80 -sm-count=108")  # an A100
            tc.Target("cuda -arch=sm_90a")                   # an H100, through Target
    """

    kind: str
    arch: str
    sm_count: int
    warp_size: int
    max_threads_per_block: int
    max_shared_memory_per_block: int
    max_shared_memory_per_block_optin: int
    registers_per_block: int
    max_registers_per_thread: int
    l2_bytes: int
    max_vthread: int
    max_vector_bytes: int

    def __init__(self, spec: str | Mapping[str, Any] | CudaTarget | None = None, **overrides: Any) -> None:
        given = given_fields(spec, CudaTarget, "a CUDA target", _EXAMPLE, _OPTIONS, "-sm-count=108")
        given.update(overrides)
        for name, value in _resolve(given).items():
            object.__setattr__(self, name, value)

    @classmethod
    def device(cls, index: int = 0) -> CudaTarget:
        """The facts of GPU ``index`` (as CUDA numbers the GPUs this process sees), read once
        through ``cuda-bindings``.

        Raises:
            TargetError: If ``cuda-bindings`` is not installed or the GPU does not answer.
        """
        found = _detect_device(index)
        if isinstance(found, TargetError):
            raise found
        return found

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CudaTarget:
        """The target ``to_json`` wrote.

        Raises:
            TargetError: If a field is missing or invalid.
        """
        check_complete(data, CudaTarget, "CUDA target")
        return cls(data)

    @property
    def nvcc_arch(self) -> str:
        """nvcc's ``-arch`` value, ``"sm_90"`` or ``"sm_90a"``."""
        return self.arch

    @property
    def compute_capability(self) -> tuple[int, int]:
        """``(9, 0)`` for sm_90 and sm_90a."""
        digits = self.arch[3:].removesuffix("a")
        return int(digits[:-1]), int(digits[-1])


_FIELD_NAMES = tuple(f.name for f in fields(CudaTarget))
_INT_FIELDS = _FIELD_NAMES[2:]  # all but kind and arch
_OPTIONS = option_names(CudaTarget)


def _resolve(given: Mapping[str, Any]) -> dict[str, Any]:
    """The arch's table facts (or GPU 0's, or sm_90's without an arch), then ``given`` over them."""
    unknown = sorted(set(given) - set(_FIELD_NAMES))
    if unknown:
        raise TargetError(f"unknown CUDA target field(s) {', '.join(unknown)}; "
                          f"the fields are {', '.join(_FIELD_NAMES)}")
    kind = given.get("kind", "cuda")
    if kind != "cuda":
        raise TargetError(f"target kind {kind!r} is not a GPU; a CudaTarget's kind is 'cuda', as in {_EXAMPLE} "
                          f"(a CPU is Target('llvm'))")
    if "arch" in given:
        values = _arch_facts(given["arch"], every_field_given=set(_FIELD_NAMES) <= set(given))
    else:
        found = _detect_device()
        values = _arch_facts(_FALLBACK_ARCH) if isinstance(found, TargetError) else found.to_json()
    values.update(given)
    for name in _INT_FIELDS:
        value = values[name]
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise TargetError(f"CUDA target {name}={value!r} must be an integer >= 1, e.g. sm_count=108")
    return values


def _arch_facts(arch: Any, every_field_given: bool = False) -> dict[str, Any]:
    """The table's facts for ``arch`` (``sm_90a`` has ``sm_90``'s). An arch the table lacks,
    such as a newer GPU's that was detected, is accepted when every field is given."""
    if not isinstance(arch, str) or not _ARCH_PATTERN.fullmatch(arch):
        raise TargetError(f"CUDA arch {arch!r} is not an nvcc arch; write it like sm_90 or sm_90a, as in {_EXAMPLE}")
    facts = _ARCHS.get(arch.removesuffix("a"))
    if facts is None:
        if every_field_given:
            return {}
        raise TargetError(f"CUDA arch {arch} is unknown; the known archs are {', '.join(_ARCHS)} (each also with "
                          f"an 'a' suffix, as sm_90a), or give every field, as str(CudaTarget.device()) spells them")
    sm_count, optin_bytes, l2_bytes = facts
    return {"kind": "cuda", "arch": arch, "sm_count": sm_count, **_COMMON,
            "max_shared_memory_per_block_optin": optin_bytes, "l2_bytes": l2_bytes}


@functools.cache
def _detect_device(index: int = 0) -> CudaTarget | TargetError:
    """GPU ``index``'s facts through the driver API, or the error that says why they cannot be read."""
    try:
        from cuda.bindings import driver
    except ImportError:
        return TargetError(f"reading the GPU needs the cuda-bindings package: {_INSTALL}")

    def call(function: Any, *args: Any) -> Any:
        status, *result = function(*args)  # every call returns (CUresult, results...)
        if status != driver.CUresult.CUDA_SUCCESS:
            raise TargetError(f"no GPU could be read: {function.__name__} returned {getattr(status, 'name', status)}; "
                              f"check nvidia-smi, or name the GPU, as in {_EXAMPLE}")
        return result[0] if result else None

    def attribute(name: str) -> int:
        return int(call(driver.cuDeviceGetAttribute, getattr(driver.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}"),
                        device))

    try:
        call(driver.cuInit, 0)
        device = call(driver.cuDeviceGet, index)
        major, minor = attribute("COMPUTE_CAPABILITY_MAJOR"), attribute("COMPUTE_CAPABILITY_MINOR")
        return CudaTarget({**_COMMON, "kind": "cuda", "arch": f"sm_{major}{minor}",
                           "sm_count": attribute("MULTIPROCESSOR_COUNT"), "warp_size": attribute("WARP_SIZE"),
                           "max_threads_per_block": attribute("MAX_THREADS_PER_BLOCK"),
                           "max_shared_memory_per_block": attribute("MAX_SHARED_MEMORY_PER_BLOCK"),
                           "max_shared_memory_per_block_optin": attribute("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"),
                           "registers_per_block": attribute("MAX_REGISTERS_PER_BLOCK"),
                           "l2_bytes": attribute("L2_CACHE_SIZE")})
    except TargetError as error:
        return error
    except RuntimeError as error:  # the package is there but the driver library is not
        return TargetError(f"no GPU could be read: {error}; check nvidia-smi, or name the GPU, as in {_EXAMPLE}")
