"""Count the core's lines of code per package against the budgets given on the command line.

A line of code is a line that holds a token of Python other than a comment: blank lines,
comments and docstrings (the string that opens a module, class or function) are not
counted, so documenting never costs budget.

    python .ci/line_budget.py tilecraft te=1500 search=3000 ... total=15000

Prints one row per package (a subpackage, or the modules at the root together as
"(root)") and exits with 1 when any package or the total is over its budget.
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from pathlib import Path

SKIPPED = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
           tokenize.ENDMARKER, tokenize.ENCODING}


def docstring_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def code_lines(source: str) -> int:
    docstrings = docstring_lines(ast.parse(source))
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in SKIPPED:
            lines.update(line for line in range(token.start[0], token.end[0] + 1) if line not in docstrings)
    return len(lines)


def main(argv: list[str]) -> int:
    root = Path(argv[0])
    budgets = dict(arg.split("=") for arg in argv[1:])
    counts: dict[str, int] = {}
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).parts
        package = relative[0] if len(relative) > 1 else "(root)"
        counts[package] = counts.get(package, 0) + code_lines(path.read_text())
    counts["total"] = sum(counts.values())
    over = []
    print(f"{'package':<10} {'code lines':>10} {'budget':>8}")
    for package, count in sorted(counts.items(), key=lambda item: item[0] == "total"):
        budget = int(budgets.get(package, 0)) or None
        print(f"{package:<10} {count:>10} {budget or '-':>8}")
        if budget is None and package != "total":
            over.append(f"{package} has no budget")
        elif budget is not None and count > budget:
            over.append(f"{package} is {count - budget} lines over its budget of {budget}")
    for problem in over:
        print(f"line budget: {problem}: shrink it, or set its budget in .ci/run on purpose, with the reason",
              file=sys.stderr)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
