"""Schedules: primitives over an immutable loop state (with its bound inference), recorded as a replayable trace."""

from .schedule import BlockRV, ExprRV, LoopRV, Schedule
from .trace import Step, Trace

__all__ = ["BlockRV", "ExprRV", "LoopRV", "Schedule", "Step", "Trace"]
