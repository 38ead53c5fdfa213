"""The SQLite record store against the log and ``Database`` on 100,000 tuning records.

    python benchmarks/database_store.py [--records 100000] [--out FILE]

Writes the synthetic records of ``benchmarks/database_open.py`` (real sketch traces of six
workloads, 5% errors) into a log, with a re-measurement (5 final records) per workload as
a tuning run ends with, then times: importing the log into a new store (``import_log``),
and the best of one workload on its target three ways, each checked to be the same
record: ``RecordStore.best``, ``load_best_record`` on the log, and ``Database`` (its open,
which indexes the log, and ``query_best``); and reading all records of that workload from
the store and from the log. The queries are timed warm (the files in the OS cache, the
best of three); the store's open is only its connection and a check of its version.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import tempfile
import time
from pathlib import Path

import numpy as np

import tilecraft as tc
from tilecraft.database import Database, RecordStore, TuningRecord, load_best_record, load_records
from tilecraft.database.database import RECORDS_FILE

from database_open import WORKLOADS, write_records  # benchmarks/, beside this script
from tables import numeric_table, print_table


def append_finals(path: Path, rng: np.random.Generator, per_workload: int = 5) -> None:
    """Re-measure ``per_workload`` schedules of each workload (taken from the log's first lines) as final records."""
    with open(path) as file:
        head = [TuningRecord.from_json_line(next(file)) for _ in range(len(WORKLOADS) * per_workload)]
    with open(path, "a") as file:
        for n, record in enumerate(head):
            final = dataclasses.replace(record, phase="final", error_kind="none", error_msg="", timestamp=2e9 + n,
                                        costs=tuple(float(c) for c in rng.uniform(1e-4, 1e-3, 5)))
            file.write(final.to_json_line() + "\n")


def best_of(repeat: int, function) -> tuple[float, object]:
    """The shortest of ``repeat`` timed calls, and the last result."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        result = function()
        times.append(time.perf_counter() - started)
    return min(times), result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/database_store.json"))
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as work_dir:
        log = Path(work_dir) / RECORDS_FILE
        megabytes = write_records(log, args.records, rng)
        append_finals(log, rng)
        task = tc.SearchTask(func=WORKLOADS[0][0], args=WORKLOADS[0][1])
        key, target = task.workload_key, str(tc.Target.host())

        started = time.perf_counter()
        with RecordStore(Path(work_dir) / "records.db") as store:
            imported = store.import_log(log)
        import_secs = time.perf_counter() - started  # closed too: the last connection checkpoints the WAL
        store_mb = (Path(work_dir) / "records.db").stat().st_size / 1e6
        with RecordStore(Path(work_dir) / "records.db") as store:
            open_store_secs, _ = best_of(args.repeat, lambda: RecordStore(store.path).close())
            store_secs, from_store = best_of(args.repeat, lambda: store.best(key, target))
            store_records_secs, in_store = best_of(args.repeat, lambda: store.records(key, target))
        log_secs, from_log = best_of(args.repeat, lambda: load_best_record(log, key, target))
        log_records_secs, in_log = best_of(args.repeat, lambda: load_records(log, key, target))
        open_secs, database = best_of(args.repeat, lambda: Database(work_dir))
        query_secs, from_database = best_of(args.repeat, lambda: database.query_best(key, target))
    assert from_store == from_log == from_database and from_store.phase == "final", "the three disagree"
    assert in_store == in_log

    table = numeric_table("what", "seconds")
    rows = {"import the log into a new store": import_secs, "RecordStore: open": open_store_secs,
            "RecordStore.best": store_secs, "load_best_record (the log)": log_secs,
            "Database: open (index the log)": open_secs, "Database.query_best": query_secs,
            f"RecordStore.records ({len(in_store)} of the workload)": store_records_secs,
            "load_records of the workload (the log)": log_records_secs}
    for name, secs in rows.items():
        table.add_row(name, f"{secs:.4f}")
    print(f"{imported} records, log {megabytes:.0f} MB, store {store_mb:.0f} MB; best of one workload "
          f"({len(WORKLOADS)} in all) on {target.split()[0]} ...")
    print_table(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "target": target},
        "records": imported, "log_mb": round(megabytes, 1), "store_mb": round(store_mb, 1),
        "workload": [WORKLOADS[0][0], list(WORKLOADS[0][1])], "repeat": args.repeat,
        "seconds": {"import_log": import_secs, "store_open": open_store_secs, "store_best": store_secs,
                    "load_best_record": log_secs, "database_open": open_secs, "database_query_best": query_secs,
                    "store_records_of_workload": store_records_secs, "load_records_of_workload": log_records_secs},
        "records_of_workload": len(in_store),
    }, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
