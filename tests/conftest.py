"""Shared fixtures: compiled kernels go to a session-wide temporary cache, never ~/.cache;
made-up logs to teach and rank cost models without measuring. Under ``-m "not slow"`` a module
marked slow as a whole is not even imported."""

import numpy as np
import pytest

from tilecraft.database.record import TuningRecord, trace_key
from tilecraft.search.evolution import Candidate
from tilecraft.search.features import feature_names
from tilecraft.search.policy import SketchPolicy

from quick_subset import left_out_of_quick_subset

INNERMOST = "matmul.j.t3"


def pytest_ignore_collect(collection_path, config):
    """Under ``-m "not slow"``, the modules slow as a whole are not imported (``quick_subset.py``)."""
    return True if left_out_of_quick_subset(collection_path, config.getoption("markexpr")) else None


@pytest.fixture(scope="session")
def kernel_cache(tmp_path_factory):
    """A directory for ``tc.build(..., cache_dir=kernel_cache)``, shared by the whole session."""
    return tmp_path_factory.mktemp("tilecraft_kernels")


@pytest.fixture(scope="session")
def made_up_log():
    """``write(path, task, count, seed=0, failing_every=8)`` appends ``count`` of a matmul
    ``task``'s candidates to the log at ``path`` and returns their records. The cost is made
    up: bigger innermost spatial tiles are faster, and every ``failing_every``-th fails (0:
    none)."""
    return _write_made_up_log


def _write_made_up_log(path, task, count: int, seed: int = 0, failing_every: int = 8) -> list[TuningRecord]:
    policy = SketchPolicy(task)
    sketch = next(n for n, s in enumerate(policy.sketches) if INNERMOST in feature_names(s))
    rows = policy.sketches[sketch].sample_uniform(np.random.default_rng(seed), count)
    candidates = [Candidate(sketch, tuple(int(v) for v in row)) for row in rows]
    innermost = policy.features(candidates)[:, policy.feature_space.names.index(INNERMOST)]
    records = []
    for n, (candidate, tile) in enumerate(zip(candidates, innermost)):
        fails = failing_every and n % failing_every == failing_every - 1
        records.append(TuningRecord(task.workload_key, task.workload, str(task.target),
                                    trace_key(policy.trace_of(candidate)), () if fails else (1e-3 / (1 + tile),),
                                    "runtime" if fails else "none", "", 0.1, 0.0, task.compute_dag.flop_count(), None))
    with open(path, "a") as file:
        file.writelines(record.to_json_line() + "\n" for record in records)
    return records
