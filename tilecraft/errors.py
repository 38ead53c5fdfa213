"""The exceptions a user can meet; each message names the thing at fault and the fix."""


class TilecraftError(Exception):
    """Base of every tilecraft error."""


class TeError(TilecraftError, ValueError):
    """A tensor expression or compute definition is malformed."""


class ScheduleError(TilecraftError, ValueError):
    """A schedule primitive cannot be applied; the schedule is left unchanged."""


class TargetError(TilecraftError, ValueError):
    """A target string or dict cannot be understood."""


class LoweringError(TilecraftError):
    """A schedule could not be turned into a loop nest (a bug or an unsupported pattern)."""


class BuildError(TilecraftError):
    """The C compiler is missing or rejected the generated code."""


class BuildTimeoutError(BuildError):
    """The C compiler ran longer than the allowed time and was stopped."""


class GpuLimitError(ScheduleError):
    """A GPU schedule that its target cannot run: too many threads or too much shared
    memory per block, a block loop inside a thread loop, an over-wide vector."""
