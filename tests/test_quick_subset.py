"""The quick subset (``-m "not slow"``) stays quick: a test module that imports PyTorch when it is
collected is slow as a whole, and such a module is not even imported by the quick subset."""

import ast
from pathlib import Path

from quick_subset import SLOW_MODULE, left_out_of_quick_subset

TESTS = Path(__file__).parent
HEAVY = {"torch"}


def imports_when_collected(path: Path) -> set[str]:
    """The top-level packages ``path`` imports at module level, ``pytest.importorskip`` included,
    and those that the test folders' helper modules it imports do."""
    names = set()
    for statement in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(statement, ast.Import):
            names |= {alias.name.split(".")[0] for alias in statement.names}
        elif isinstance(statement, ast.ImportFrom) and statement.module and not statement.level:
            names.add(statement.module.split(".")[0])
        elif isinstance(statement, (ast.Assign, ast.Expr)) and isinstance(statement.value, ast.Call):
            call = statement.value
            if getattr(call.func, "attr", None) == "importorskip" and isinstance(call.args[0], ast.Constant):
                names.add(call.args[0].value.split(".")[0])
    helpers = {name for name in names if (path.parent / f"{name}.py").exists()}
    return names.union(*(imports_when_collected(path.parent / f"{name}.py") for name in helpers))


def test_modules_that_import_pytorch_when_collected_are_slow_as_a_whole():
    heavy = [path.relative_to(TESTS) for path in TESTS.rglob("test_*.py") if imports_when_collected(path) & HEAVY]
    assert heavy, "no test module imports PyTorch: the check below checks nothing"
    unmarked = [str(path) for path in heavy if SLOW_MODULE not in (TESTS / path).read_text(encoding="utf-8")]
    assert not unmarked, f"{unmarked} import PyTorch when collected: mark them slow as a whole ({SLOW_MODULE.strip()})"


def test_the_quick_subset_leaves_out_the_modules_slow_as_a_whole_and_nothing_else(tmp_path):
    slow, quick = tmp_path / "test_slow.py", tmp_path / "test_quick.py"
    slow.write_text(f'import pytest\n{SLOW_MODULE.strip()}\n')
    quick.write_text('import pytest\n\n\n@pytest.mark.slow\ndef test_one():\n    pass\n')
    assert left_out_of_quick_subset(slow, "not  slow")
    assert not left_out_of_quick_subset(quick, "not slow")
    assert not left_out_of_quick_subset(slow, "") and not left_out_of_quick_subset(slow, "slow")
