"""The loop-nest IR, index arithmetic, bound inference and lowering."""

from .lower import lower

__all__ = ["lower"]
