"""tilecraft: automatic scheduling of tensor programs into fast native kernels.

Map of the package:
  te/         the tensor-expression language (placeholder, compute, reduce_axis) and
              ComputeDAG, with its NumPy reference evaluation (te/reference.py)
  ops/        a library of operators written in te (matmul, conv2d, softmax, ...)
  schedule/   Schedule primitives over an immutable loop state; traces (JSON, Python)
  ir/         loop-nest IR, index arithmetic, bound inference, lowering passes, printer
  codegen/    C with OpenMP and SIMD from the IR
  runtime/    compiler cache, ctypes Module called with NumPy arrays, timer
  target.py   the CPU description (ISA, vector width, cores, caches)
  build.py    schedule -> lowered IR -> C -> shared library -> Module
"""

from . import te
from .build import build
from .errors import BuildError, LoweringError, ScheduleError, TargetError, TeError, TilecraftError
from .ir.lower import lower
from .schedule import Schedule, Trace
from .target import Target
from .te.dag import ComputeDAG

__all__ = [
    "te", "build", "lower", "Schedule", "Trace", "Target", "ComputeDAG", "BuildError", "LoweringError",
    "ScheduleError", "TargetError", "TeError", "TilecraftError",
]
