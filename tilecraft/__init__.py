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
  search/     sketch rules, decision spaces, features, cost models, evolutionary search
  measure/    building and timing candidates in isolated processes
  database/   the JSON-lines tuning log and "best over the whole history"
  tune/       SearchTask, TuningOptions and the tuning loop, progress display
  frontend/   model importers: ONNX to a Graph
  graph/      whole models: the node graph IR and its passes, fusion into subgraphs, task
              extraction, CompiledModel (compile_model, save, load_model)
"""

from . import frontend, te
from .build import build
from .errors import BuildError, LoweringError, ScheduleError, TargetError, TeError, TilecraftError
from .ir.lower import lower
from .schedule import Schedule, Trace
from .target import Target
from .te.dag import ComputeDAG
from .database import Database, RecordToFile, load_best_record, load_records
from .measure import LocalBuilder, LocalRunner, MeasureErrorKind
from .search.cost_model import LightGBMModel, RandomModel, XGBModel
from .search.policy import PreloadMeasuredStates, SketchPolicy
from .search.space import ScheduleFn
from .search.transfer import DEFAULT_RECORDS, transfer_model
from .tune import workloads  # registers the built-in workloads (matmul, conv2d, ...)
from .tune.scheduler import TaskScheduler
from .tune.task import SearchTask, TuningOptions, register_workload
from .graph.compiled import CompiledModel, compile_model, load_model
from .graph.tasks import extract_tasks, print_tasks
from .tune.tir import compile_tir, tune_tir

__all__ = [
    "te", "frontend", "build", "lower", "Schedule", "Trace", "Target", "ComputeDAG", "BuildError", "LoweringError",
    "ScheduleError", "TargetError", "TeError", "TilecraftError", "Database", "RecordToFile", "load_best_record",
    "load_records", "LocalBuilder", "LocalRunner", "MeasureErrorKind", "LightGBMModel", "RandomModel", "XGBModel",
    "PreloadMeasuredStates", "ScheduleFn", "SketchPolicy", "SearchTask", "TaskScheduler", "TuningOptions",
    "register_workload", "workloads", "transfer_model", "DEFAULT_RECORDS",
    "tune_tir", "compile_tir", "CompiledModel", "compile_model", "load_model", "extract_tasks", "print_tasks",
]
