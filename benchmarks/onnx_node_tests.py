"""The whole ONNX backend node-test suite through tilecraft's importer, reference runner and compiler.

    python benchmarks/onnx_node_tests.py [--out benchmarks/results/onnx_node_tests.json] [--only REGEX]
                                         [--target "cuda -arch=sm_90" [--cuda-source]]

Prints how many cases pass, fail and are refused as unsupported (with the failing names and
a count of refusals by reason; ``--only`` keeps the cases whose name matches a regular
expression, ``--only 'test_(equal|less)'``), once through the NumPy reference runner and once through
compiled native kernels (default schedules), and writes them as JSON. ``--target cuda ...``
compiles them for that GPU instead (CUDA C built, every kernel emulated on this CPU): what
a model of those operators computes there, on a machine without one; with ``--cuda-source``,
the kernels' CUDA C itself run there (``tc.emulate_gpu(..., cuda_source=True)``). The cases and their
judging are those of tests/frontend/node_cases.py; pytest runs the cases of the supported
operators both ways.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "frontend"))
from node_cases import FAIL, PASS, UNSUPPORTED, collect_cases, run_case  # noqa: E402
from tables import numeric_table, print_table  # noqa: E402  (benchmarks/tables.py, beside this script)


def _reasons(message: str) -> list[str]:
    """The unsupported operators of a refusal's table, or its first line without node and input names."""
    rows = message.splitlines()[2:-1]
    if message.startswith("the model uses") and rows:
        return sorted({f"operator {row.split()[1]}" for row in rows})
    return [re.sub(r"node \S+ |input \S+ ", "", message.splitlines()[0]).split("; change the model")[0][:100]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/onnx_node_tests.json"))
    parser.add_argument("--only", default="", help="run only the cases whose name matches this regular expression")
    parser.add_argument("--target", default=None, help='compile for this target instead, "cuda -arch=sm_90" emulated')
    parser.add_argument("--cuda-source", action="store_true", help="with a CUDA target: run the kernels' CUDA C")
    args = parser.parse_args()
    start = time.perf_counter()
    with warnings.catch_warnings(), tempfile.TemporaryDirectory() as cache:
        warnings.simplefilter("ignore")  # the generators overflow casts and divide by zero on purpose
        cases = [case for case in collect_cases(supported_only=False) if re.search(args.only, case.name)]
        results = {case.name: run_case(case) for case in cases}
        compiled = {case.name: run_case(case, compiled=True, cache_dir=cache, target=args.target,
                                        cuda_source=args.cuda_source) for case in cases
                    if results[case.name][0] != UNSUPPORTED}
    by_status = {status: sorted(name for name, (got, _) in results.items() if got == status)
                 for status in (PASS, FAIL, UNSUPPORTED)}
    compiled_status = {status: sorted(name for name, (got, _) in compiled.items() if got == status)
                       for status in (PASS, FAIL)}
    reasons = collections.Counter(reason for status, message in results.values() if status == UNSUPPORTED
                                  for reason in _reasons(message))
    print(f"{len(cases)} node tests in {time.perf_counter() - start:.0f} s")
    print(f"  reference runner: {len(by_status[PASS])} pass, {len(by_status[FAIL])} fail, "
          f"{len(by_status[UNSUPPORTED])} unsupported")
    print(f"  compiled kernels ({args.target or 'this CPU'}): {len(compiled_status[PASS])} pass, "
          f"{len(compiled_status[FAIL])} fail, {len(by_status[UNSUPPORTED])} unsupported")
    for name in by_status[FAIL]:
        print(f"  FAIL (reference) {name}: {results[name][1][:160]}")
    for name in compiled_status[FAIL]:
        print(f"  FAIL (compiled) {name}: {compiled[name][1][:160]}")
    print("most common reasons for unsupported (a case may have several):")
    table = numeric_table("reason", "cases")
    for reason, count in reasons.most_common(25):
        table.add_row(reason, str(count))
    print_table(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "target": args.target or "this CPU", "cuda_source": args.cuda_source,
        "counts": {status: len(names) for status, names in by_status.items()},
        "compiled_counts": {status: len(names) for status, names in compiled_status.items()},
        "failures": {name: results[name][1] for name in by_status[FAIL]},
        "compiled_failures": {name: compiled[name][1] for name in compiled_status[FAIL]},
        "unsupported": {name: results[name][1].splitlines()[0] for name in by_status[UNSUPPORTED]},
        "unsupported_reasons": dict(reasons.most_common()),
        "passed": by_status[PASS],
    }, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
