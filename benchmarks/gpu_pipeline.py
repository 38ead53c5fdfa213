"""Double-buffered shared tiles, and A's tile laid out along i, against the same tiles as
tuned, on a GPU, in one run.

    python benchmarks/gpu_pipeline.py [--sizes 1024,2048,4096] [--out FILE]

For each size, the fastest ``gpu_tile`` schedule of the kept H100 matmul log
(``benchmarks/records/gpu_h100_matmul_N.json.xz``) whose shared tiles fit twice in a block's
shared memory is built as it is, as the ``gpu_tile_pipelined`` sketch's candidate of the
same decisions (its shared tiles double-buffered across the reduction's steps, copied by
``cp.async``, ``ir/pipeline.py``), and as the ``gpu_tile_transposed`` sketch's (A's tile
stored with i contiguous, its rows padded: a thread's rows of A read 16 bytes at a time),
and as the ``gpu_tile_transposed_pipelined`` sketch's (that, double-buffered, A's tile copied
by a 4-byte ``cp.async`` a float).
Each is checked against ``torch.matmul`` and timed with CUDA events after an L2 flush,
beside ``torch.matmul`` itself (cuBLAS, TF32 off), timed the same way. Needs a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

import tilecraft as tc
from tilecraft.database.log import best_records
from tilecraft.ir.nodes import AsyncWait, walk_stmts
from tilecraft.schedule.trace import Trace
from tilecraft.search.space import generate_sketches

sys.path.insert(0, str(Path(__file__).parent))
from archive import restore  # noqa: E402
from gpu_ops import time_torch  # noqa: E402  (each call after an L2 flush, as ours)


def same_tiles(n: int, target) -> tuple[int, object, object, object, object]:
    """The kept log's best gpu_tile schedule of matmul n^3 whose tiles fit twice in a block's
    shared memory (a larger one stays serial), as it is, pipelined, with A's tile along i and
    both, with its rank among the log's schedules."""
    dag = tc.SearchTask(func="matmul", args=(n, n, n), target=target).compute_dag
    sketches = {s.name: s for s in generate_sketches(dag, target=target)}
    log = Path(tempfile.mkdtemp()) / "matmul.json"
    restore(Path(__file__).parent / "records" / f"gpu_h100_matmul_{n}.json.xz", log)
    for rank, record in enumerate(best_records(log, top_k=100) if log.exists() else ()):
        trace = Trace.from_json(record.trace)
        row = sketches["gpu_tile"].row_of(trace) if record.sketch == "gpu_tile" else None
        piped = None if row is None else sketches["gpu_tile_pipelined"].trace_of(row).replay(dag)
        if piped is not None and any(isinstance(s, AsyncWait) for s in walk_stmts(tc.lower(piped).body)):
            return rank, trace.replay(dag), piped, *(sketches[name].trace_of(row).replay(dag) for name in (
                "gpu_tile_transposed", "gpu_tile_transposed_pipelined"))
    raise SystemExit(f"no gpu_tile record for matmul {n}^3 in benchmarks/records whose tiles fit twice; tune it "
                     f"first: python benchmarks/gpu_ops.py --only matmul_{n}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1024,2048,4096")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/gpu_pipeline.json"))
    options = parser.parse_args()
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    target = tc.CudaTarget.device()
    rows = []
    names = ("as_tuned", "pipelined", "a_along_i", "a_along_i_pipelined")
    print(f"{'n':>6} {'as tuned':>10} {'pipelined':>10} {'A along i':>10} {'both':>10} {'cuBLAS':>10}   TFLOPS; "
          f"each / as tuned", flush=True)
    for n in (int(s) for s in options.sizes.split(",")):
        rank, *schedules = same_tiles(n, target)
        rng = np.random.default_rng(0)
        a, b = (torch.from_numpy(rng.standard_normal((n, n), dtype=np.float32)).cuda() for _ in range(2))
        expected = torch.matmul(a, b)
        row = {"n": n, "record_rank": rank}
        for name, sch in zip(names, schedules):
            kernel = tc.build(sch, target)
            error = float((kernel(a, b) - expected).abs().max() / expected.abs().max())
            if error > 1e-4:
                raise SystemExit(f"matmul {n}^3 {name}: relative error {error:.1e}")
            row[name] = 2 * n**3 / kernel.time_evaluator(number=10, repeat=5, flush_l2=True)(a, b).median / 1e12
        row["cublas"] = 2 * n**3 / time_torch(torch.matmul, (a, b), 10, 5) / 1e12
        ratios = ", ".join(f"{row[name] / row['as_tuned']:.2f}x" for name in names[1:])
        print(f"{n:>6} " + " ".join(f"{row[name]:>10.1f}" for name in (*names, "cublas"))
              + f"   {ratios} (the log's schedule {rank + 1})", flush=True)
        rows.append(row)
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps({"device": torch.cuda.get_device_name(0), "rows": rows}, indent=1))
    print("wrote", options.out)


if __name__ == "__main__":
    main()
