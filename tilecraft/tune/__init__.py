"""Tuning: the loop that searches, measures and records, and how it reports progress."""

from . import workloads  # noqa: F401 - registers the built-in workloads (matmul, conv2d, ...) before any task names one
