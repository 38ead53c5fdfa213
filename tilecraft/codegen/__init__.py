"""Code generation from the loop-nest IR: C with OpenMP and SIMD for CPUs."""

from .c import generate_c

__all__ = ["generate_c"]
