import numpy as np

from tilecraft.runtime.evict import weight_evictor


def test_evicting_writes_back_what_was_written():
    buffers = [np.arange(100_003, dtype=np.float32), np.full((7, 9), 3.5)]  # odd sizes: a partial last line
    expected = [b + 1 for b in buffers]
    for b in buffers:
        b += 1  # dirty lines: an eviction that dropped them would lose these writes
    evict = weight_evictor([b[1:] for b in buffers])  # views that start inside a cache line
    evict()
    evict()
    assert all(np.array_equal(b, e) for b, e in zip(buffers, expected))
