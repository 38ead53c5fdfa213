"""Prefetch of the next chunk of packed weights: in the loop that reuses a chunk (the rows
inside a reduction chunk), a share of the next chunk per iteration, only for weights that
outgrow L2; the kernel's results unchanged."""

import re

import numpy as np
import pytest

import tilecraft as tc
from tilecraft.codegen.c import generate_c
from tilecraft.ir.lower import lower
from tilecraft.search.default import JOBS_PER_CORE, default_row
from tilecraft.search.space import generate_sketches
from tilecraft.tune.task import WORKLOADS


def _rows_inside_reduction_chunks(dag, target):
    """The sketch that accumulates in a local buffer inside the consumer's tile, with the rows
    inside the outer reduction loop (SSRSRS level 2): each 16-channel chunk of the weights
    used by all 7 rows, as tuned ResNet-50 records do."""
    sketch = next(s for s in generate_sketches(dag, target=target) if s.name.endswith("fuse2"))
    row = default_row(sketch, JOBS_PER_CORE * target.num_cores)
    names = [slot.name for slot in sketch.slots]
    for name, decision in (("y", (1, 1, 7, 1)), ("x", (1, 1, 1, 7)), ("f", (4, 1, 1, 32)), ("ry", (1, 3)),
                           ("rx", (1, 3)), ("rc", (4, 16))):
        slot = next(n for n, s in enumerate(names) if s.endswith(f".{name}"))
        row[slot] = sketch.index_of(slot, decision)
    return sketch.trace_of(row).replay(dag)


@pytest.mark.parametrize("l2_bytes, prefetched", [(64 * 1024, True),
                                                  pytest.param(1024 * 1024, False, marks=pytest.mark.slow)])
def test_the_rows_of_a_chunk_prefetch_the_next_chunk_of_weights_that_outgrow_l2(l2_bytes, prefetched, kernel_cache):
    target = tc.Target(tc.Target.host(), l2_bytes=l2_bytes)
    dag = tc.ComputeDAG(WORKLOADS["conv2d_nhwc"](1, 7, 7, 64, 128, 3, 3, 1, 1))  # weights 288 KB
    sch = _rows_inside_reduction_chunks(dag, target)
    source = generate_c(lower(sch, "conv"), target)
    assert ("__builtin_prefetch" in source) == prefetched
    if prefetched:
        lines = [line.strip() for line in source.splitlines()]
        at = next(n for n, line in enumerate(lines) if line.startswith("__builtin_prefetch"))
        assert re.match(r"for \(int32_t y_2 = 0; y_2 < 7; \+\+y_2\) \{", lines[at - 3])  # each row...
        assert lines[at - 2] == "if (rc_0 < 3) {"  # ...while a next chunk exists
        share = -(-3 * 3 * 16 * 32 * 4 // 7)  # ...its seventh of the next 18 KB chunk
        assert lines[at - 1] == f"for (int32_t tc_line = 0; tc_line < {share}; tc_line += 64) {{"
        assert re.search(r"\(rc_0 \* 4608\).*\+ 4608\).*\(y_2 \* 658\)", lines[at])  # the next chunk, this row's share
    inputs = dag.random_inputs()
    np.testing.assert_allclose(tc.build(sch, target, cache_dir=kernel_cache)(*inputs),
                               dag.evaluate_numpy(inputs)[0], rtol=1e-4, atol=1e-4)


def test_no_prefetch_outside_a_register_tile():
    target = tc.Target(tc.Target.host(), l2_bytes=1024)
    for dag in (tc.ComputeDAG(WORKLOADS["softmax"](16, 64)), tc.ComputeDAG(WORKLOADS["matmul"](64, 64, 64))):
        assert "__builtin_prefetch" not in generate_c(lower(tc.Schedule(dag), "f"), target)
