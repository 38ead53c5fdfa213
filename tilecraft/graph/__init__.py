"""Whole models as graphs of tilecraft operators: the IR, the operator registry, passes and a NumPy runner;
fusion into subgraphs (``fuse``), task extraction (``tasks``) and compiled models (``compiled``)."""

from .ir import Graph, Node, Value
from .operators import OPERATORS, Operator
from .passes import eliminate_dead_code, fold_batch_norm, fuse_gelu, simplify, sink_reshapes
from .reference import run_reference

__all__ = ["Graph", "Node", "Value", "OPERATORS", "Operator", "eliminate_dead_code", "fold_batch_norm", "fuse_gelu",
           "simplify", "sink_reshapes", "run_reference"]
