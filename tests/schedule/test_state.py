"""The loop state: immutable stages whose loops start as the compute's axes, with split
and fuse relations that derive new loops, and a state that each primitive replaces."""

import dataclasses

import pytest

import tilecraft as tc
from tilecraft import te
from tilecraft.schedule.state import Attach, Fuse, Loop, Split, State, ceil_div, common_prefix, initial_stage

from small_dags import matmul_relu  # tests/schedule/small_dags.py


def _diamond():
    """P is read by Q and R, R reads Q, and S reads R before Q."""
    A = te.placeholder((6,), name="A")
    P = te.compute((6,), lambda i: A[i] + 1.0, name="P")
    Q = te.compute((6,), lambda i: P[i] * 2.0, name="Q")
    R = te.compute((6,), lambda i: Q[i] * 3.0 + P[i], name="R")
    S = te.compute((6,), lambda i: R[i] + Q[i], name="S")
    return tc.ComputeDAG([A, S])


def test_an_initial_stage_has_the_spatial_axes_then_the_reduction_axes_as_its_loops():
    _, C, _ = matmul_relu()
    stage = initial_stage(C.op, C, first_id=5, is_output=False)
    assert [(l.id, l.name, l.kind, l.extent) for l in stage.loops] == [
        (5, "i", "spatial", 16), (6, "j", "spatial", 12), (7, "k", "reduce", 8)]
    assert stage.roots == stage.leaves == (5, 6, 7)
    assert stage.relations == () and stage.attach is None and stage.is_reduction and not stage.is_output


def test_a_schedule_numbers_the_loops_of_its_stages_consecutively():
    dag, _, _ = matmul_relu()
    state = tc.Schedule(dag).state
    assert [s.name for s in state.stages] == ["C", "D"]
    assert [l.id for s in state.stages for l in s.loops] == list(range(5)) and state.next_id == 5
    assert not state.stage("C").is_output and state.stage("D").is_output and not state.stage("D").is_reduction


def test_stages_and_loops_are_frozen():
    dag, _, _ = matmul_relu()
    state = tc.Schedule(dag).state
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.stage("C").loops[0].extent = 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.stage("C").leaves = ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.stages = ()


def test_with_loop_replaces_only_that_loop_and_leaves_the_old_stage_as_it_was():
    dag, _, _ = matmul_relu()
    stage = tc.Schedule(dag).state.stage("C")
    changed = stage.with_loop(dataclasses.replace(stage.loop(1), annotation="vectorize"))
    assert [l.annotation for l in changed.loops] == ["", "vectorize", ""]
    assert [l.annotation for l in stage.loops] == ["", "", ""]


def test_with_stage_replaces_the_stage_of_that_name_in_place():
    dag, _, _ = matmul_relu()
    state = tc.Schedule(dag).state
    moved = dataclasses.replace(state.stage("C"), scope="local")
    new = state.with_stage(moved)
    assert [s.name for s in new.stages] == ["C", "D"] and new.stage("C").scope == "local"
    assert state.stage("C").scope == "global" and new.stage("D") is state.stage("D")


def test_new_ids_are_fresh_and_consecutive():
    dag, _, _ = matmul_relu()
    state = tc.Schedule(dag).state
    after, ids = state.new_ids(3)
    assert ids == [5, 6, 7] and after.next_id == 8 and state.next_id == 5
    _, more = after.new_ids(1)
    assert more == [8]


def test_lookups_find_the_stage_of_a_name_and_of_a_loop_or_raise_key_error():
    dag, _, _ = matmul_relu()
    state = tc.Schedule(dag).state
    assert state.stage_of_loop(2).name == "C" and state.stage_of_loop(4).name == "D"
    assert state.stage("D").loop(4).name == "j" and state.stage("D").has_loop(3)
    assert not state.stage("D").has_loop(0)
    for lookup in (lambda: state.stage("E"), lambda: state.stage_of_loop(99), lambda: state.stage("C").loop(3)):
        with pytest.raises(KeyError):
            lookup()


def test_producers_come_in_topological_order_not_in_the_order_they_are_read():
    state = tc.Schedule(_diamond()).state
    assert [s.name for s in state.stages] == ["P", "Q", "R", "S"]
    # reverse_compute_at anchors at the last producer: R, which runs after Q
    assert [s.name for s in state.producers_of(state.stage("S"))] == ["Q", "R"]
    assert [s.name for s in state.consumers_of("P")] == ["Q", "R"]
    assert [s.name for s in state.consumers_of("Q")] == ["R", "S"]
    assert state.producers_of(state.stage("P")) == []  # it reads only a placeholder
    assert state.consumers_of("S") == []


def test_a_split_records_its_parent_children_and_the_factors_of_the_inner_pieces():
    dag, _, _ = matmul_relu()
    sch = tc.Schedule(dag)
    i, _, _ = sch.get_loops(sch.get_block("C"))
    assert [l.id for l in sch.split(i, [None, 3, 2])] == [5, 6, 7]  # the state's next free ids
    stage = sch.state.stage("C")
    assert stage.relations == (Split(0, (5, 6, 7), (3, 2)),)
    assert stage.leaves == (5, 6, 7, 1, 2) and stage.roots == (0, 1, 2)
    assert [stage.loop(l).extent for l in (5, 6, 7)] == [ceil_div(16, 6), 3, 2]
    assert [stage.loop(l).name for l in (5, 6, 7)] == ["i_0", "i_1", "i_2"]
    assert stage.has_loop(0)  # the split loop stays, no longer a leaf


def test_a_fuse_records_its_parents_and_iterates_over_their_product():
    dag, _, _ = matmul_relu()
    sch = tc.Schedule(dag)
    i, j = sch.get_loops(sch.get_block("D"))
    fused = sch.fuse(i, j)
    stage = sch.state.stage("D")
    assert stage.relations == (Fuse((3, 4), fused.id),)
    assert stage.leaves == (fused.id,) and stage.loop(fused.id).extent == 16 * 12
    assert stage.loop(fused.id).kind == "spatial"


def test_compute_at_and_reverse_compute_at_attach_in_opposite_directions():
    dag, _, _ = matmul_relu()
    sch = tc.Schedule(dag)
    i, _ = sch.get_loops(sch.get_block("D"))
    sch.compute_at(sch.get_block("C"), i)
    assert sch.state.stage("C").attach == Attach("D", i.id, reverse=False)
    sch = tc.Schedule(dag)
    i, _, _ = sch.get_loops(sch.get_block("C"))
    sch.reverse_compute_at(sch.get_block("D"), i)
    assert sch.state.stage("D").attach == Attach("C", i.id, reverse=True)


def test_a_primitive_builds_a_new_state_and_a_refused_one_keeps_the_old():
    dag, _, _ = matmul_relu()
    sch = tc.Schedule(dag)
    before = sch.state
    i, j, k = sch.get_loops(sch.get_block("C"))
    sch.split(i, [None, 4])
    assert sch.state is not before and before.stage("C").leaves == (0, 1, 2) and before.next_id == 5
    after_split = sch.state
    with pytest.raises(tc.ScheduleError):
        sch.fuse(j, k)  # a spatial and a reduction loop
    assert sch.state is after_split


def test_ceil_div_rounds_up_for_positive_operands():
    assert [ceil_div(n, 4) for n in (1, 4, 5, 8, 9)] == [1, 1, 2, 2, 3]
    assert ceil_div(0, 4) == 0 and ceil_div(12, 1) == 12


def test_common_prefix_is_the_loops_leading_to_every_path():
    assert common_prefix([[1, 2, 3], [1, 2, 4], [1, 2]]) == [1, 2]
    assert common_prefix([[1, 2, 3]]) == [1, 2, 3]
    assert common_prefix([[1, 2], [3, 2]]) == []
    assert common_prefix([]) == []


def test_loop_and_state_defaults():
    loop = Loop(0, "i", "spatial", 8)
    assert loop.annotation == "" and loop.pragmas == ()
    assert State(()).next_id == 0 and State(()).packed == ()
