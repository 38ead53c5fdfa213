"""Which test modules the quick subset (``-m "not slow"``) leaves out without importing them."""

from pathlib import Path

SLOW_MODULE = "\npytestmark = pytest.mark.slow"


def left_out_of_quick_subset(path: Path, markexpr: str) -> bool:
    """Whether ``path`` is a test module whose every test is slow (a line that starts
    ``pytestmark = pytest.mark.slow``) and ``markexpr`` leaves out slow tests: all its tests
    would be deselected, but only after each test worker imported it, and PyTorch's import
    alone costs a worker seconds."""
    return (path.suffix == ".py" and path.name.startswith("test_") and " ".join(markexpr.split()) == "not slow"
            and SLOW_MODULE in path.read_text(encoding="utf-8"))
