"""Schedules: primitives over a loop state, recorded as a replayable trace."""

from .schedule import BlockRV, ExprRV, LoopRV, Schedule
from .trace import Step, Trace

__all__ = ["BlockRV", "ExprRV", "LoopRV", "Schedule", "Step", "Trace"]
