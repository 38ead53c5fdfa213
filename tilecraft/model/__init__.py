"""Whole models end to end: tuning tasks extracted from a model (``tasks``) and the compiled model that runs
each fused subgraph with its best kernel (``compiled``; on a GPU, ``gpu``)."""

from .compiled import CompiledModel, compile_model, load_model
from .gpu import GpuModel
from .tasks import extract_tasks, print_tasks

__all__ = ["CompiledModel", "GpuModel", "compile_model", "load_model", "extract_tasks", "print_tasks"]
