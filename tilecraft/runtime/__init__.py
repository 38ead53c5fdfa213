"""The runtime: from generated C source to a timed, callable kernel.

``compile_c`` turns C source into a shared library through gcc (cached on disk by
content), ``Module`` loads it and calls its entry on NumPy arrays with their shapes and
dtypes checked (packing weights once when asked), and ``time_callable`` /
``Module.time_evaluator`` measure it with TVM's ``time_evaluator`` protocol so numbers
compare across tools.
"""

from .compiler import compile_c
from .module import ArgSpec, Module, PackSpec, aligned_empty
from .timer import ProfileResult, time_callable

__all__ = ["compile_c", "ArgSpec", "Module", "PackSpec", "aligned_empty", "ProfileResult", "time_callable"]
