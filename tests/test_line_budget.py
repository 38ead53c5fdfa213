"""The CI's line budget counts code only: documenting must never cost budget."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / ".ci" / "line_budget.py"
spec = importlib.util.spec_from_file_location("line_budget", SCRIPT)
line_budget = importlib.util.module_from_spec(spec)
spec.loader.exec_module(line_budget)

SOURCE = '''"""A module docstring
over two lines."""

# a comment

def f(x):
    """A function docstring."""
    y = (x +  # a trailing comment
         1)
    return f"""{y}
text"""
'''


def test_docstrings_comments_and_blank_lines_are_not_code():
    assert line_budget.code_lines(SOURCE) == 5  # def, the two lines of y, the two of the f-string


def test_a_package_over_its_budget_fails_and_says_which(tmp_path, capsys):
    package = tmp_path / "core" / "sub"
    package.mkdir(parents=True)
    (package / "a.py").write_text("x = 1\ny = 2\n")
    (tmp_path / "core" / "top.py").write_text("z = 3\n")
    assert line_budget.main([str(tmp_path / "core"), "sub=2", "(root)=1", "total=3"]) == 0
    assert line_budget.main([str(tmp_path / "core"), "sub=1", "(root)=1", "total=3"]) == 1
    assert "sub is 1 lines over its budget of 1" in capsys.readouterr().err
    assert line_budget.main([str(tmp_path / "core"), "sub=2", "total=3"]) == 1
    assert "(root) has no budget" in capsys.readouterr().err


def test_the_total_has_a_budget_too(tmp_path):
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "top.py").write_text("z = 3\nw = 4\n")
    assert line_budget.main([str(tmp_path / "core"), "(root)=5", "total=1"]) == 1
