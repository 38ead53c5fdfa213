"""Features of candidates, computed for a whole population from its decisions.

Every feature is named, and a task's columns are the union of its sketches' names, so a
tile size of ``matmul.i`` means the same column in every sketch that samples it (a sketch
without it leaves NaN, which the tree models treat as missing). Per candidate:
- which sketch it comes from (one-hot);
- log2 of every tile factor, and per tiled block and tile level the log2 product of its
  spatial and of its reduction factors, and of everything inside that level (the tile's
  footprint, which decides what stays in registers and caches);
- the unroll step, the number of parallel loops and the log2 parallel extent, the log2
  length of each vectorized loop, and each sampled compute location;
- on a GPU, log2 of the launch along each bound axis (blocks, virtual threads, threads per
  block), of the shared memory a block uses, and of the waves of blocks over the SMs at
  full occupancy (``gpu_waves``): what decides whether the SMs are filled, which the tile
  factors say only in sum.
"""

from __future__ import annotations

import numpy as np

from .space import Sketch


def _level_groups(sketch: Sketch) -> dict[str, list[int]]:
    """Feature name -> factor columns summed into it (per block, level and loop kind)."""
    groups: dict[str, list[int]] = {}
    for column, (slot_index, position) in enumerate(sketch.factor_columns):
        slot = sketch.slots[slot_index]
        if slot.role != "tile":  # a sampled thread count: the GPU features hold it
            continue
        block = slot.name.split(".")[0]
        kind = "S" if slot.spatial else "R"
        groups.setdefault(f"{block}.{kind}{position}", []).append(column)
        for level in range(1, position + 1):
            groups.setdefault(f"{block}.{kind}inside{level}", []).append(column)
    return groups


def feature_names(sketch: Sketch) -> list[str]:
    names = [f"sketch={sketch.name}"]
    for slot in sketch.slots:
        if slot.role == "tile":
            names += [f"{slot.name}.t{p}" for p in range(len(slot.domain[0]))]
        else:
            names.append(slot.name)
        if slot.role == "parallel":
            names.append(f"{slot.name}.extent")
    names += list(_level_groups(sketch))
    names += [f"{block}.vector" for block in sketch.vector_loops]
    names += [f"gpu.{axis}" for axis in sketch.gpu_axes] + (["gpu.shared_bytes"] if sketch.shared_tiles else [])
    return names + (["gpu_waves"] if "blockIdx.x" in sketch.gpu_axes and "threadIdx.x" in sketch.gpu_axes else [])


def sketch_features(sketch: Sketch, rows: np.ndarray) -> np.ndarray:
    """The features of ``rows`` (candidates of ``sketch``) in ``feature_names(sketch)`` order."""
    rows = np.asarray(rows, dtype=np.int64).reshape(len(rows), len(sketch.slots))
    logs = sketch.log_factors(rows)
    columns = [np.ones(len(rows))]
    for index, slot in enumerate(sketch.slots):
        if slot.role == "tile":
            columns += [logs[:, c] for c, (owner, _) in enumerate(sketch.factor_columns) if owner == index]
        elif slot.role == "unroll":
            columns.append(np.log2(1 + np.asarray(slot.values, dtype=float)[rows[:, index]]))
        elif slot.role == "parallel":
            count = np.asarray(slot.values, dtype=float)[rows[:, index]]
            columns.append(count)
            extents = np.stack([f.evaluate(logs) for f in sketch.parallel_loops[index]], axis=1)
            used = np.arange(extents.shape[1])[None, :] < count[:, None]
            columns.append((extents * used).sum(axis=1))
        else:
            columns.append(rows[:, index].astype(float))
    for group in _level_groups(sketch).values():
        columns.append(logs[:, group].sum(axis=1))
    for form in sketch.vector_loops.values():
        columns.append(form.evaluate(logs))
    extents = sketch.gpu_extents(rows, logs)
    columns += list(extents.values())
    if sketch.shared_tiles:
        columns.append(np.log2(sketch.shared_bytes(rows, logs)))
    if "blockIdx.x" in extents and "threadIdx.x" in extents:  # 2,048 threads and 32 blocks an SM
        blocks_per_sm = np.clip(11 - extents["threadIdx.x"], 0, 5)  # log2 min(2048 / threads, 32)
        blocks = sum(extent for axis, extent in extents.items() if axis.startswith("blockIdx"))  # split-K's .y too
        columns.append(blocks - blocks_per_sm - np.log2(sketch.gpu_limits.get("sm_count", 1)))
    return np.stack(columns, axis=1)


class FeatureSpace:
    """The union of the named features of a task's sketches."""

    def __init__(self, sketches: list[Sketch]):
        self.sketches = sketches
        self.names: list[str] = []
        self._positions: list[np.ndarray] = []
        index: dict[str, int] = {}
        for sketch in sketches:
            positions = []
            for name in feature_names(sketch):
                if name not in index:
                    index[name] = len(self.names)
                    self.names.append(name)
                positions.append(index[name])
            self._positions.append(np.array(positions))

    def features(self, sketch_index: int, rows: np.ndarray) -> np.ndarray:
        out = np.full((len(rows), len(self.names)), np.nan)
        for n, sketch in enumerate(self.sketches):  # other sketches' one-hot columns are 0
            out[:, self._positions[n][0]] = 0.0
        if len(rows):
            out[:, self._positions[sketch_index]] = sketch_features(self.sketches[sketch_index], rows)
        return out
