"""Build tilecraft's default database (``tilecraft/database/default_records.json.xz``) from
the records the ablation keeps (``benchmarks/records``).

It holds, for each operator workload of the ablation and each machine that measured it,
the sample a +transfer arm of the ablation teaches its cost model (``transfer_sample``:
the fastest quarter and a random rest, failures included), so a first tuning on a new
machine starts from what the ablation measured transfer to give (docs/experiments/default-database.md).
The quick workloads are left out: matmul 512 is the README's first tuning, which should
learn from other workloads, as the ablation measured it. GPU records come from
``benchmarks/gpu_ops.py``'s logs, kept as ``benchmarks/records/gpu_*.json.xz``, so that a
first tuning on a GPU starts taught too (transfer matches GPUs by arch).
The sample is the same every time for the same records: run it again when they grew.

    python benchmarks/default_database.py
"""

from __future__ import annotations

import argparse
import lzma
from pathlib import Path

from ablation import WORKLOADS

from tilecraft.database.log import load_records
from tilecraft.tune.transfer import DEFAULT_RECORDS, TRANSFER_ROWS, transfer_sample


def sampled_lines(archive: Path, rows: int) -> list[str]:
    """The sample of each target's records in ``archive``, as log lines."""
    by_target: dict[str, list] = {}
    for record in load_records(archive):
        by_target.setdefault(record.target, []).append(record)
    return [record.to_json_line() + "\n" for records in by_target.values()
            for record in transfer_sample(records, rows)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--archive", default="benchmarks/records", help="where the ablation keeps its records")
    parser.add_argument("--rows", type=int, default=TRANSFER_ROWS, help="records of each workload and machine")
    parser.add_argument("--out", default=str(DEFAULT_RECORDS))
    args = parser.parse_args()
    lines = []
    gpu_logs = sorted(path.name.removesuffix(".json.xz") for path in Path(args.archive).glob("gpu_*.json.xz"))
    for name in [*WORKLOADS, *gpu_logs]:
        archive = Path(args.archive) / f"{name}.json.xz"
        if not archive.exists():
            print(f"{name}: no records, left out (benchmarks/ablation.py --only {name} makes them)")
            continue
        found = sampled_lines(archive, args.rows)
        print(f"{name}: {len(found)} records")
        lines += found
    data = lzma.compress("".join(lines).encode(), preset=9)
    Path(args.out).write_bytes(data)
    print(f"{args.out}: {len(lines)} records, {len(data) / 1e3:.0f} kB")


if __name__ == "__main__":
    main()
