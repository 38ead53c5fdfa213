"""The examples in the documents run: every Python block of a page under docs/, and the README's tour.

A page's blocks run in order, as one script, in a fresh Python process in an empty
directory, so an example that extends a registry or writes a log touches nothing else.
A block meant to be read but not run is not marked as Python (``text``, ``json``). A page
whose examples import an optional extra that is not installed (PyTorch, Ray, cuda-bindings)
is skipped, naming the extra: the README's test command installs only the test extra, CI all.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_BLOCK = re.compile(r"^```python[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
_SLOW_PAGES = {"extending.md", "models.md"}  # they tune for a few trials, or compile whole models
_EXTRAS = {"torch": "torch", "ray": "ray", "cuda": "cuda"}  # a module an example imports -> the extra with it
_IMPORT = re.compile(r"^\s*(?:import|from)\s+(\w+)", re.MULTILINE)


def python_blocks(markdown: str) -> list[str]:
    return _BLOCK.findall(markdown)


def missing_extras(source: str) -> list[str]:
    """The optional extras that ``source`` imports from and this environment lacks."""
    return sorted({f"{module} (pip install -e '.[{_EXTRAS[module]}]')" for module in _IMPORT.findall(source)
                   if module in _EXTRAS and importlib.util.find_spec(module) is None})


def run_script(source: str, directory: Path) -> subprocess.CompletedProcess:
    script = directory / "example.py"
    script.write_text(source)
    return subprocess.run([sys.executable, "-W", "error::DeprecationWarning", str(script)], cwd=directory,
                          capture_output=True, text=True, timeout=600)


PAGES = sorted(path for path in (ROOT / "docs").rglob("*.md") if python_blocks(path.read_text()))


@pytest.mark.parametrize("page", [pytest.param(p, marks=pytest.mark.slow) if p.name in _SLOW_PAGES else p
                                  for p in PAGES], ids=lambda p: str(p.relative_to(ROOT)))
def test_the_python_blocks_of_a_page_run(page, tmp_path):
    source = "\n\n".join(python_blocks(page.read_text()))
    if missing := missing_extras(source):
        pytest.skip(f"its examples need {', '.join(missing)}")
    result = run_script(source, tmp_path)
    assert result.returncode == 0, f"an example in {page.relative_to(ROOT)} failed:\n{result.stderr[-3000:]}"


def test_the_readme_tour_runs(tmp_path):
    tour = python_blocks((ROOT / "README.md").read_text())[0]
    assert "tc.Schedule(dag)" in tour, "the README's first Python block should be the five-minute tour"
    result = run_script(tour, tmp_path)
    assert result.returncode == 0, f"the README's tour failed:\n{result.stderr[-3000:]}"


def test_an_example_needing_an_extra_that_is_not_installed_names_it():
    source = "import json\nfrom tilecraft_missing_extra import x\n    import tilecraft_missing_extra.sub\n"
    _EXTRAS["tilecraft_missing_extra"] = "missing"
    try:
        assert missing_extras(source) == ["tilecraft_missing_extra (pip install -e '.[missing]')"]
        assert missing_extras("import json\n") == []
    finally:
        del _EXTRAS["tilecraft_missing_extra"]


def test_a_failing_example_fails_the_test(tmp_path):
    blocks = python_blocks("text\n```python\nx = 1\n```\n\n```text\nnot run\n```\n```python\nassert x == 2\n```\n")
    assert blocks == ["x = 1\n", "assert x == 2\n"]
    assert run_script("\n\n".join(blocks), tmp_path).returncode != 0
