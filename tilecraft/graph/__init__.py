"""Whole models as graphs of tilecraft operators: the IR, the operator registry, passes, a NumPy runner,
layout conversion and fusion into subgraphs (``fuse``); ``tilecraft.model`` extracts tasks and compiles."""

from .ir import Graph, Node, Value
from .operators import OPERATORS, Operator
from .passes import eliminate_dead_code, fold_batch_norm, fuse_gelu, simplify, sink_reshapes
from .reference import run_reference

__all__ = ["Graph", "Node", "Value", "OPERATORS", "Operator", "eliminate_dead_code", "fold_batch_norm", "fuse_gelu",
           "simplify", "sink_reshapes", "run_reference"]
