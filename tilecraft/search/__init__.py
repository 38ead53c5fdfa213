"""Search: sketches, candidate populations, learned cost models and the search policy."""

from .replay import ReplayTrace

__all__ = ["ReplayTrace"]
