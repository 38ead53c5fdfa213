"""benchmarks/default_database.py: the default database is a transfer sample of each
workload's records per machine, rebuilt from the ablation's archive."""

import itertools
import lzma
import subprocess
import sys
from pathlib import Path

import pytest

import tilecraft as tc
from tilecraft.database.log import load_records

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.slow
def test_it_samples_each_machines_records_of_each_workload_and_leaves_out_what_has_none(tmp_path):
    archive = tmp_path / "records"
    archive.mkdir()
    with lzma.open(BENCHMARKS / "records" / "dense_1x2048x1000.json.xz", "rt") as source:
        head = list(itertools.islice(source, 200))  # the first 200 records: one machine's
    with lzma.open(archive / "dense_1x2048x1000.json.xz", "wt") as target:
        target.writelines(head)
    out = tmp_path / "default.json.xz"
    done = subprocess.run([sys.executable, str(BENCHMARKS / "default_database.py"), "--archive", str(archive),
                           "--rows", "40", "--out", str(out)], capture_output=True, text=True, check=True)
    assert "conv2d_r50_3x3: no records, left out" in done.stdout
    sampled = load_records(out)
    whole = load_records(archive / "dense_1x2048x1000.json.xz")
    assert len({r.target for r in whole}) == 1
    assert len(sampled) == 40 and {r.trace_json for r in sampled} <= {r.trace_json for r in whole}
    fastest = sorted(r.mean_cost for r in whole)[:10]
    assert sorted(r.mean_cost for r in sampled)[:10] == fastest  # the fastest quarter of the sample
    assert lzma.decompress(out.read_bytes()).count(b"\n") == 40


@pytest.mark.slow
def test_the_shipped_database_holds_registered_workloads_of_x86_machines_and_an_h100():
    records = load_records(tc.DEFAULT_RECORDS)
    cpu = [r for r in records if tc.Target(r.target).kind != "cuda"]
    assert len(cpu) > 10_000
    assert {tc.Target(r.target).isa for r in cpu} == {"avx2", "avx512"}
    assert {r.workload["func"] for r in cpu} == {"conv2d_nhwc", "matmul", "dense", "batch_matmul"}
    shapes = {tuple(r.workload["args"][:3]) for r in cpu if r.workload["func"] == "matmul"}
    assert shapes == {(1024, 1024, 1024)}  # not 512³: the README's first tuning should learn other workloads
    gpu = [r for r in records if tc.Target(r.target).kind == "cuda"]
    assert {tc.Target(r.target).arch for r in gpu} == {"sm_90"} and all("@" in r.device for r in gpu)
    assert {r.workload["func"] for r in gpu} == {"matmul", "conv2d", "dense", "softmax", "layer_norm"}
