"""The machines a kernel is scheduled and compiled for: a CPU (``Target``, cpu.py) or an
NVIDIA GPU (``CudaTarget``, cuda.py). ``Target(spec)`` is the one entry point for both: a
spec of kind ``cuda`` gives a ``CudaTarget``.
"""

from .cpu import ISAS, Target
from .cpu import _isa_from_cpuinfo  # noqa: F401 (tests/test_target.py tests it)
from .cuda import CudaTarget

__all__ = ["ISAS", "CudaTarget", "Target"]
