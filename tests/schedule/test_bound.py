"""Bound inference: a stage attached inside a loop computes only the region that loop's
iterations read (or, reverse-attached, consume only what they wrote), with a constant
extent; loops of a split iterate only as far as the region reaches."""

import dataclasses

import numpy as np
import pytest

import tilecraft as tc
from tilecraft import te
from tilecraft.errors import LoweringError
from tilecraft.schedule.bound import BoundInference, loop_extents, loop_path, refresh_extents
from tilecraft.schedule.state import Attach
from tilecraft.te.arith import bounds
from tilecraft.te.expr import Binary, const


def _inference(state) -> BoundInference:
    return BoundInference(state, lambda name: loop_path(state, name))


def _add_then_double(rows: int = 8, columns: int = 6):
    A = te.placeholder((rows, columns), name="A")
    P = te.compute((rows, columns), lambda i, j: A[i, j] + 1.0, name="P")
    O = te.compute((rows, columns), lambda i, j: P[i, j] * 2.0, name="O")
    return tc.ComputeDAG([A, O])


def _window_sum():
    """O (8 x 8) sums a 3 x 3 window of P (10 x 10): a tile of O needs a halo of P."""
    A = te.placeholder((10, 10), name="A")
    P = te.compute((10, 10), lambda i, j: A[i, j] + 1.0, name="P")
    di, dj = te.reduce_axis((0, 3), name="di"), te.reduce_axis((0, 3), name="dj")
    O = te.compute((8, 8), lambda i, j: te.sum(P[i + di.var, j + dj.var], axis=[di, dj]), name="O")
    return tc.ComputeDAG([A, O])


def test_a_stage_at_the_root_computes_its_whole_tensor():
    sch = tc.Schedule(_window_sum())
    inference = _inference(sch.state)
    assert inference.of("P").root_extent == (10, 10) and inference.of("P").root_min == (const(0), const(0))
    assert inference.of("O").root_extent == (8, 8, 3, 3)  # the reduction axes in full


def test_a_producer_at_an_outer_tile_loop_computes_one_tile_starting_where_the_tile_does():
    sch = tc.Schedule(_add_then_double())
    i, _ = sch.get_loops(sch.get_block("O"))
    i0, _ = sch.split(i, [None, 4])
    sch.compute_at(sch.get_block("P"), i0)
    inference = _inference(sch.state)
    b = inference.of("P")
    assert b.root_extent == (4, 6)
    assert b.root_min == (Binary("mul", inference.loop_vars[i0.id], const(4)), const(0))


def test_a_producer_at_an_inner_loop_computes_one_element():
    sch = tc.Schedule(_add_then_double())
    _, j = sch.get_loops(sch.get_block("O"))
    sch.compute_at(sch.get_block("P"), j)
    assert _inference(sch.state).of("P").root_extent == (1, 1)


def test_a_window_consumer_needs_a_halo_of_its_producer():
    sch = tc.Schedule(_window_sum())
    i, j, _, _ = sch.get_loops(sch.get_block("O"))
    at_row = sch.copy()
    at_row.compute_at(at_row.get_block("P"), i)
    assert _inference(at_row.state).of("P").root_extent == (3, 10)  # 1 row + 2 of halo, every column
    sch.compute_at(sch.get_block("P"), j)
    assert _inference(sch.state).of("P").root_extent == (3, 3)  # one output element's window


def test_a_window_over_a_tile_of_rows_is_the_tile_plus_the_halo():
    sch = tc.Schedule(_window_sum())
    i, _, _, _ = sch.get_loops(sch.get_block("O"))
    i0, _ = sch.split(i, [None, 2])
    sch.compute_at(sch.get_block("P"), i0)
    b = _inference(sch.state).of("P")
    assert b.root_extent == (2 + 2, 10)
    assert [l.extent for l in sch.state.stage("P").loops] == [4, 10]  # refreshed to the region


def test_the_last_tile_of_a_non_dividing_split_is_shifted_back_into_the_tensor():
    sch = tc.Schedule(_add_then_double(rows=10))
    i, _ = sch.get_loops(sch.get_block("O"))
    i0, _ = sch.split(i, [None, 4])  # tiles start at rows 0, 4, 8: the last reaches past row 9
    sch.compute_at(sch.get_block("P"), i0)
    inference = _inference(sch.state)
    b = inference.of("P")
    assert b.root_extent == (4, 6)
    start = bounds(b.root_min[0], inference.ranges())
    assert start == (0, 10 - 4)  # every region lies inside the 10 rows


def _tiled_prime_matmul(pack_b: bool):
    """A 13x11x19 matmul accumulating 4x8 tiles in a local buffer inside its copy's tiles."""
    A = te.placeholder((13, 11), name="A")
    B = te.placeholder((11, 19), name="B")
    k = te.reduce_axis((0, 11), name="k")
    C = te.compute((13, 19), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C",
                   attrs={"layout_free_placeholders": [B]})
    sch = tc.Schedule([A, B, C])
    c = sch.get_block("C")
    copy = sch.cache_write(c, 0, "local")
    if pack_b:  # B stored in tiles of 8 columns, padded to 24: reads past column 18 stay inside
        sch.transform_layout(c, ("read", 1), lambda k, j: (j // 8, k, j % 8))
    i, j = sch.get_loops(copy)
    i0, i1 = sch.split(i, [None, 4])
    j0, j1 = sch.split(j, [None, 8])
    sch.reorder(i0, j0, i1, j1)
    sch.compute_at(c, j0)
    return sch


@pytest.mark.parametrize("pack_b", [False, True])
def test_a_last_tile_runs_past_the_end_where_its_reads_stay_inside_and_is_shifted_where_not(pack_b):
    """Rows read A, which ends at row 12: the last row tile is shifted back. Columns read B:
    unpacked it ends at column 18, so the tile is shifted; packed in whole tiles of 8 it
    reaches 23, so the tile runs on past the end unguarded (a shifted tile of a packed
    weight would read it by gathers) and the copy stores only what lies inside."""
    sch = _tiled_prime_matmul(pack_b)
    inference = _inference(sch.state)
    b = inference.of("C")
    assert b.padded == (frozenset({1}) if pack_b else frozenset())
    ranges = inference.ranges()
    assert bounds(b.root_min[0], ranges) == (0, 13 - 4)
    assert bounds(b.root_min[1], ranges) == ((0, 16) if pack_b else (0, 19 - 8))
    a, w = sch.dag.random_inputs()
    np.testing.assert_allclose(tc.build(sch)(a, w), a @ w, rtol=1e-5, atol=1e-5)


def test_an_intermediate_computed_in_its_consumer_covers_its_whole_last_tile_unguarded():
    """A matmul of 24 columns tiled by 16 (padded to 32), computed inside its ReLU's row
    tile: its buffer is its own, and B packed in whole tiles of 16 stays inside past column
    23, so it computes both column tiles whole (32 columns, no guard) and the ReLU stores 24.
    Guarded, the vector loop ran scalar: GoogLeNet's 1x1 convolution 512→24 took 0.35 ms in
    the model, 0.046 unguarded."""
    A = te.placeholder((6, 8), name="A")
    B = te.placeholder((8, 24), name="B")
    k = te.reduce_axis((0, 8), name="k")
    C = te.compute((6, 24), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C",
                   attrs={"layout_free_placeholders": [B]})
    R = te.compute((6, 24), lambda i, j: te.max(C[i, j], te.const(0.0)), name="R")
    sch = tc.Schedule([A, B, R])
    c = sch.get_block("C")
    sch.transform_layout(c, ("read", 1), lambda k, j: (j // 16, k, j % 16))
    i, j, _ = sch.get_loops(c)
    j0, j1, j2 = sch.split(j, [1, 2, 16])
    ri, _ = sch.get_loops(sch.get_block("R"))
    ri0, _ = sch.split(ri, [None, 2])
    sch.compute_at(c, ri0)
    b = _inference(sch.state).of("C")
    assert 1 in b.padded and b.root_extent[1] == 32
    func = tc.lower(sch)
    assert "< 24" not in str(func).split("R[")[0]  # no guard on C's columns
    a, w = sch.dag.random_inputs()
    np.testing.assert_allclose(tc.build(sch)(a, w), np.maximum(a @ w, 0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("b_shift, o_shift, columns", [(0, 1, 9), (1, 0, 9), (2, 0, 10), (1, 1, 8)])
def test_a_producer_read_by_two_consumers_computes_the_union_of_their_reads(b_shift, o_shift, columns):
    A = te.placeholder((8, 10), name="A")
    P = te.compute((8, 10), lambda i, j: A[i, j] + 1.0, name="P")
    B = te.compute((8, 8), lambda i, j: P[i, j + b_shift] * 2.0, name="B")
    O = te.compute((8, 8), lambda i, j: B[i, j] + P[i, j + o_shift], name="O")
    sch = tc.Schedule(tc.ComputeDAG([A, O]))
    i, _ = sch.get_loops(sch.get_block("O"))
    sch.compute_at(sch.get_block("B"), i)
    sch.compute_at(sch.get_block("P"), i)
    inference = _inference(sch.state)
    assert inference.of("B").root_extent == (1, 8)
    b = inference.of("P")
    assert b.root_extent == (1, columns)  # 8 columns from each, as far apart as the shifts
    assert b.root_min == (inference.loop_vars[i.id], const(min(b_shift, o_shift)))


def test_a_consumer_reverse_computed_at_a_tile_loop_consumes_that_tile():
    sch = tc.Schedule(_add_then_double())
    i, _ = sch.get_loops(sch.get_block("P"))
    i0, _ = sch.split(i, [None, 4])
    sch.reverse_compute_at(sch.get_block("O"), i0)
    inference = _inference(sch.state)
    b = inference.of("O")
    assert b.root_extent == (4, 6)
    assert b.root_min[0] == Binary("mul", inference.loop_vars[i0.id], const(4))
    assert inference.region_written_inside("P", i0.id) == (list(b.root_min), [4, 6])


def test_writes_inside_a_loop_form_a_box_only_when_the_inner_loops_sweep_without_gaps():
    sch = tc.Schedule(_add_then_double())
    i, j = sch.get_loops(sch.get_block("P"))
    i0, i1 = sch.split(i, [None, 2])
    sch.reorder(i1, i0, j)  # inside i1, rows i1, i1 + 2, i1 + 4, ...
    inference = _inference(sch.state)
    assert not inference.writes_box_inside("P", i1.id)
    assert inference.writes_box_inside("P", i0.id)  # one row
    assert inference.writes_box_inside("P", j.id)


def test_a_reverse_attachment_whose_producer_writes_no_box_is_a_lowering_error():
    sch = tc.Schedule(_add_then_double())
    i, j = sch.get_loops(sch.get_block("P"))
    i0, i1 = sch.split(i, [None, 2])
    sch.reorder(i1, i0, j)
    state = sch.state  # attach by hand: the schedule primitive refuses this location itself
    state = state.with_stage(dataclasses.replace(state.stage("O"), attach=Attach("P", i1.id, reverse=True)))
    with pytest.raises(LoweringError, match="elements of P that block P writes inside loop i_1 do not form a box"):
        _inference(state).of("O")
    with pytest.raises(LoweringError, match="do not form a box"):
        refresh_extents(state, "O")


def test_stages_attached_inside_each_other_are_a_lowering_error():
    sch = tc.Schedule(_add_then_double())
    state = sch.state
    o_row, p_row = state.stage("O").leaves[0], state.stage("P").leaves[0]
    state = state.with_stage(dataclasses.replace(state.stage("P"), attach=Attach("O", o_row, reverse=False)))
    state = state.with_stage(dataclasses.replace(state.stage("O"), attach=Attach("P", p_row, reverse=True)))
    with pytest.raises(LoweringError, match="block (O|P) is attached in a cycle"):
        BoundInference(state, lambda name: []).of("O")


def test_refresh_extents_sets_the_nominal_extents_of_the_new_location():
    sch = tc.Schedule(_window_sum())
    _, j, _, _ = sch.get_loops(sch.get_block("O"))
    state = sch.state
    moved = state.with_stage(dataclasses.replace(state.stage("P"), attach=Attach("O", j.id, reverse=False)))
    assert [l.extent for l in moved.stage("P").loops] == [10, 10]  # still the root's
    refreshed = refresh_extents(moved, "P")
    assert [l.extent for l in refreshed.stage("P").loops] == [3, 3]
    assert refreshed.stage("O") is moved.stage("O")  # only P changes


def test_loop_extents_of_a_split_stop_where_the_parent_region_ends():
    sch = tc.Schedule(_add_then_double(rows=32))
    i, _ = sch.get_loops(sch.get_block("P"))
    i0, i1, i2 = sch.split(i, [None, 8, 4])
    stage = sch.state.stage("P")
    whole = loop_extents(stage, (32, 6))
    assert [whole[l.id] for l in (i0, i1, i2)] == [1, 8, 4]
    tile = loop_extents(stage, (6, 6))  # a region of 6 rows runs 1 x 2 x 4, not 1 x 8 x 4
    assert [tile[l.id] for l in (i0, i1, i2)] == [1, 2, 4]
    uneven = loop_extents(stage, (40, 6))
    assert [uneven[l.id] for l in (i0, i1, i2)] == [2, 8, 4]


def test_loop_extents_of_a_fused_loop_are_the_product_of_its_parents():
    sch = tc.Schedule(_add_then_double())
    i, j = sch.get_loops(sch.get_block("P"))
    fused = sch.fuse(i, j)
    assert loop_extents(sch.state.stage("P"), (3, 6))[fused.id] == 18


def test_a_fused_loop_gives_each_axis_back_by_division_and_remainder():
    sch = tc.Schedule(_add_then_double(rows=4))
    i, j = sch.get_loops(sch.get_block("O"))
    fused = sch.fuse(i, j)
    inference = _inference(sch.state)
    b = inference.of("O")
    f = inference.loop_vars[fused.id]
    assert b.loop_extent == {fused.id: 24}
    assert b.root_value == {i.id: Binary("floordiv", f, const(6)), j.id: Binary("floormod", f, const(6))}


def test_a_split_loop_split_again_is_kept_with_its_value_for_a_guard():
    sch = tc.Schedule(_add_then_double(rows=10))
    i, _ = sch.get_loops(sch.get_block("P"))
    _, i1 = sch.split(i, [None, 5])
    sch.split(i1, [None, 2])  # 3 x 2 iterations cover the 5 of i1: one is guarded away
    inference = _inference(sch.state)
    b = inference.of("P")
    value, extent = b.inner_split[i1.id]
    assert extent == 5 and bounds(value, inference.ranges()) == (0, 5)  # reaches past the 5: needs the guard
    assert set(b.inner_split) == {i1.id}


def test_the_loop_path_of_an_attached_stage_runs_through_its_consumers_loops_to_the_attach_loop():
    sch = tc.Schedule(_window_sum())
    i, j, di, dj = sch.get_loops(sch.get_block("O"))
    assert loop_path(sch.state, "O") == [i.id, j.id, di.id, dj.id]
    sch.compute_at(sch.get_block("P"), i)
    p_loops = list(sch.state.stage("P").leaves)
    assert loop_path(sch.state, "P") == [i.id] + p_loops
    assert sch.loop_path("P") == loop_path(sch.state, "P")
