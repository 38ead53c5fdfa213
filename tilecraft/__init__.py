"""tilecraft: automatic scheduling of tensor programs into fast native kernels.

Map of the package, lowest layer first (a package imports only from layers below it;
tests/test_layers.py checks it, docs/architecture.md draws it):
  errors.py   the exception hierarchy every layer raises
  tables.py   rich tables printed whole to a file or a pipe, or as plain text for a message
  target.py   the CPU description (ISA, vector width, cores, caches)
  te/         the tensor-expression language (placeholder, compute, reduce_axis), index
              arithmetic (te/arith.py) and ComputeDAG, with its NumPy reference evaluation
  ops/        a library of operators written in te (matmul, conv2d, softmax, ...)
  schedule/   Schedule primitives over an immutable loop state, bound inference; traces
  graph/      whole models as graphs of operators: the IR, its passes, fusion into subgraphs
  ir/         the loop-nest IR, lowering a schedule into it, and its printer
  codegen/    C with OpenMP and SIMD from the IR
  runtime/    compiler cache, ctypes Module called with NumPy arrays, timer
  frontend/   model importers: ONNX to a Graph
  build.py    schedule -> lowered IR -> C -> shared library -> Module
  database/   the JSON-lines tuning log and "best over the whole history"
  measure/    building and timing candidates in isolated processes
  search/     sketch rules, decision spaces, features, cost models, evolutionary search
  tune/       SearchTask, TuningOptions, the tuning loop, the task scheduler, transfer
  model/      task extraction from a model and CompiledModel (compile_model, save, load_model)
  cli.py      the ``tilecraft`` command
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
from .tune.transfer import DEFAULT_RECORDS, transfer_model
from .tune import workloads  # registers the built-in workloads (matmul, conv2d, ...)
from .tune.scheduler import TaskScheduler
from .tune.task import SearchTask, TuningOptions, register_workload
from .model import CompiledModel, compile_model, extract_tasks, load_model, print_tasks
from .tune.tir import compile_tir, tune_tir

__all__ = [
    "te", "frontend", "build", "lower", "Schedule", "Trace", "Target", "ComputeDAG", "BuildError", "LoweringError",
    "ScheduleError", "TargetError", "TeError", "TilecraftError", "Database", "RecordToFile", "load_best_record",
    "load_records", "LocalBuilder", "LocalRunner", "MeasureErrorKind", "LightGBMModel", "RandomModel", "XGBModel",
    "PreloadMeasuredStates", "ScheduleFn", "SketchPolicy", "SearchTask", "TaskScheduler", "TuningOptions",
    "register_workload", "workloads", "transfer_model", "DEFAULT_RECORDS",
    "tune_tir", "compile_tir", "CompiledModel", "compile_model", "load_model", "extract_tasks", "print_tasks",
]
