"""tilecraft: automatic scheduling of tensor programs into fast native kernels.

Map of the package, lowest layer first (a package imports only from layers below it;
tests/test_layers.py checks it, docs/architecture.md draws it):
  errors.py   the exception hierarchy every layer raises
  tables.py   rich tables printed whole to a file or a pipe, or as plain text for a message
  target/     the machine descriptions: the CPU's (ISA, vector width, cores, caches) and an
              NVIDIA GPU's (arch, SMs, per-block limits, L2)
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
  database/   the JSON-lines tuning log, the SQLite store many tuners share, and "best
              over the whole history"
  measure/    building and timing candidates in isolated processes
  search/     sketch rules, decision spaces, features, cost models, evolutionary search
  tune/       SearchTask, TuningOptions, the tuning loop, the task scheduler, transfer
  model/      task extraction from a model, CompiledModel (compile_model, save, load_model) and GpuModel
  cli.py      the ``tilecraft`` command
"""

import importlib

from . import te
from .build import build, emulate_gpu  # bound now: importing the module tilecraft.build later would shadow a lazy name
from .errors import BuildError, GpuLimitError, LoweringError, ScheduleError, TargetError, TeError, TilecraftError

# The rest of the API is imported on first use (PEP 562): a measuring worker, which needs
# only NumPy and the runtime, then starts in half the time, and the command line too.
_MODULES = {"frontend": ".frontend", "workloads": ".tune.workloads"}
_NAMES = {  # public name -> the module that defines it
    "lower": ".ir.lower", "Schedule": ".schedule", "Trace": ".schedule", "Target": ".target", "CudaTarget": ".target",
    "ComputeDAG": ".te.dag", "Database": ".database", "RecordToFile": ".database",
    "RecordStore": ".database", "RecordToStore": ".database",
    "load_best_record": ".database", "load_records": ".database", "LocalBuilder": ".measure",
    "LocalRunner": ".measure", "MeasureErrorKind": ".measure", "LightGBMModel": ".search.cost_model",
    "RPCRunner": ".measure", "DeviceServer": ".measure", "RayRunner": ".measure", "RayBuilder": ".measure",
    "RandomModel": ".search.cost_model", "XGBModel": ".search.cost_model",
    "PreloadMeasuredStates": ".search.policy", "SketchPolicy": ".search.policy", "ScheduleFn": ".search.space",
    "DEFAULT_RECORDS": ".tune.transfer", "transfer_model": ".tune.transfer", "TaskScheduler": ".tune.scheduler",
    "SearchTask": ".tune.task", "TuningOptions": ".tune.task", "register_workload": ".tune.task",
    "CompiledModel": ".model", "GpuModel": ".model", "compile_model": ".model", "extract_tasks": ".model",
    "load_model": ".model", "print_tasks": ".model", "choose_in_place": ".model.in_place", "from_torch": ".model.torch",
    "compile_tir": ".tune.tir", "tune_tir": ".tune.tir",
    "CudaModule": ".runtime.cuda", "cuda_available": ".runtime.cuda",
}

__all__ = ["te", "build", "emulate_gpu", "BuildError", "GpuLimitError", "LoweringError", "ScheduleError", "TargetError",
           "TeError", "TilecraftError", *_MODULES, *_NAMES]


def __getattr__(name: str):
    if name in _MODULES:
        value = importlib.import_module(_MODULES[name], __name__)
    elif name in _NAMES:
        value = getattr(importlib.import_module(_NAMES[name], __name__), name)
    else:
        raise AttributeError(f"module 'tilecraft' has no attribute {name!r}")
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
