"""The loop-nest IR, the lowering of a schedule into it, and its printer."""

from .lower import lower

__all__ = ["lower"]
