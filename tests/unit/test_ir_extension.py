"""The IR extension: per-end ranges, local steps (messages to oneself), buffer regions, per-member block tables,
explicit phases, and the verifier's provenance (which input element each element stands for)."""

from __future__ import annotations

import numpy as np
import pytest

from collectives import ScheduleError, algorithms, emulate, verify
from collectives.schedule import (
    BlockTable,
    ChunkTable,
    ExplicitOp,
    OpKind,
    Phase,
    Regions,
    Round,
    Schedule,
    explicit_phase,
    recv,
    recv_reduce,
    send,
)
from collectives.simulate import simulate
from collectives.topology import fully_connected

S, R, RR = OpKind.SEND, OpKind.RECV, OpKind.RECV_REDUCE


def one_phase(collective: str, p: int, count: int, table, rounds: list[dict[int, list]], **kw) -> Schedule:
    """Round i runs rounds[i][member] (a list of slots; absent member: idle)."""
    pattern = [Round(lambda m, it, spec=spec: spec.get(int(m), []), repeats=1) for spec in rounds]
    return Schedule("t", collective, p, count, [Phase("t", np.arange(p), table, pattern)], **kw)


def test_position_invariant_builders_keep_remote_equal_to_start():
    s = algorithms.build("ring", collective="allreduce", world_size=4, count=10)
    prog = s.program(2)
    assert np.array_equal(prog.remote, prog.start)
    assert all(o.remote == o.start for o in prog)


def test_remote_chunk_lands_elsewhere_and_both_ends_must_agree():
    # allgather p=2, k=2: rank 0 sends its block 0 to land in rank 1's block 0 (named with remote)
    table = ChunkTable.whole(4, 2)
    ok = one_phase("allgather", 2, 2, table, [{0: [send(1, 0), recv(1, 1)], 1: [send(0, 1), recv(0, 0)]}])
    assert verify(ok).messages == 2
    # rank 0 claims its block lands in rank 1's block 1, rank 1 receives it into block 0
    bad = one_phase("allgather", 2, 2, table, [{0: [send(1, 0, remote=1), recv(1, 1)],
                                                1: [send(0, 1), recv(0, 0)]}])
    with pytest.raises(ScheduleError, match=r"node 0, op 0 \(round 0, elements \[0, 2\)\): sends elements \[0, 2\) to "
                                            r"land at node 1's \[2, 4\) but node 1's matching receive \(its op 1\) "
                                            r"expects \[0, 2\); both ends of a message must name the same two ranges"):
        verify(bad)


def test_data_at_the_wrong_place_fails_with_provenance():
    # alltoall p=2, k=1: rank 0 keeps its own block but stores rank 1's block at the wrong output position.
    # Both ends agree, every element holds rank data: only the element index tells it is wrong.
    table = ChunkTable.whole(4, 4)  # chunks: in 0, in 1, out 0, out 1
    local = {m: [send(m, m, remote=2 + m), recv(m, 2 + m, remote=m)] for m in (0, 1)}
    swap = {0: [send(1, 1, remote=2), recv(1, 3, remote=1)], 1: [send(0, 1, remote=3), recv(0, 2, remote=1)]}
    bad = one_phase("alltoall", 2, 2, table, [local, swap])
    with pytest.raises(ScheduleError) as info:
        verify(bad)
    text = str(info.value)
    assert "ends with wrong data in elements [3, 4) of its alltoall output (its output elements [1, 2))" in text
    assert "stands for input elements [1, 2) instead of [0, 1)" in text
    assert "expected rank 1's input elements [0, 1)" in text
    # rank 1 sends its input block 1 (meant for itself) to rank 0: the right rank's data, the wrong element
    right = {0: [send(1, 1, remote=2), recv(1, 3, remote=0)], 1: [send(0, 0, remote=3), recv(0, 2, remote=1)]}
    verify(one_phase("alltoall", 2, 2, table, [local, right]))


def test_reduction_of_different_elements_is_rejected():
    # allreduce p=2, count=2: rank 1 reduces rank 0's element 1 into its element 0
    table = ChunkTable.whole(2, 2)
    bad = one_phase("allreduce", 2, 2, table, [{0: [send(1, 1, remote=0)], 1: [recv_reduce(0, 0, remote=1)]}])
    with pytest.raises(ScheduleError, match=r"node 1, op 0 \(round 0, elements \[0, 1\)\): reduces rank 0's input "
                                            r"elements \[1, 2\) into rank 1's input elements \[0, 1\): a reduction "
                                            r"must combine the same element of every input"):
        verify(bad)


def test_local_copy_and_local_reduce():
    # allreduce p=2, count=2 on a 4-element buffer: copy the input to scratch, exchange scratch, reduce locally
    table = ChunkTable.whole(4, 2)  # chunk 0: the vector, chunk 1: scratch
    rounds = [{m: [send(m, 0, remote=1), recv(m, 1, remote=0)] for m in (0, 1)},
              {m: [send(1 - m, 1), recv(1 - m, 1)] for m in (0, 1)},
              {m: [send(m, 1, remote=0), recv_reduce(m, 0, remote=1)] for m in (0, 1)}]
    s = one_phase("allreduce", 2, 2, table, rounds, regions=Regions(4))
    rep = verify(s)
    assert rep.messages == 2 and rep.local_steps == 4
    assert (rep.bytes_sent == [8, 8]).all()  # local steps move no bytes
    x = [np.array([1, 2], np.int64), np.array([10, 20], np.int64)]
    for out in emulate(s, x):
        assert out.tolist() == [11, 22]


def test_local_steps_cost_nothing_but_their_reduction_in_the_event_simulator():
    n = 1 << 20
    topo = fully_connected(2)
    for kind, expect_zero in ((recv, True), (recv_reduce, False)):
        s = one_phase("allreduce", 2, n, ChunkTable.whole(2 * n, 2), [{m: [send(m, 0, remote=1), kind(m, 1, remote=0)]
                                                                       for m in (0, 1)}], regions=Regions(2 * n))
        t = simulate(s, topo, mode="event").time
        assert (t == 0) == expect_zero
        if not expect_zero:  # one reduction of n float32 at the topology's reduce bandwidth
            assert t == pytest.approx(4 * n / topo.reduce_bandwidth)


def test_both_simulators_charge_a_local_reduction_and_tell_explicit_programs_apart():
    # two explicit programs of one name and shape, one copying locally and one reducing: the analytic model's
    # structure cache must not hand the first one's costs to the second (their digests differ)
    n = 1 << 20
    topo = fully_connected(2)
    for mode in ("analytic", "event"):
        times = {}
        for kind in (R, RR, R):
            ops = [[ExplicitOp(0, S, m, 0, 1, 1), ExplicitOp(0, kind, m, 1, 1, 0)] for m in (0, 1)]
            s = Schedule("same", "allreduce", 2, n, [explicit_phase("same", ops, ChunkTable.whole(2 * n, 2))],
                         regions=Regions(2 * n))
            times.setdefault(kind, set()).add(simulate(s, topo, mode=mode).time)
        assert times[R] == {0.0}, mode
        assert list(times[RR]) == [pytest.approx(4 * n / topo.reduce_bandwidth)], mode


def test_regions_place_inputs_and_outputs():
    s = Schedule("x", "allreduce", 2, 3, [], regions=Regions(10, input=0, output=5))
    assert s.work_size == 10 and s.input_range(1) == (0, 3) and s.output_range(0) == (5, 8)
    assert "regions: work buffer of 10 elements" in s.describe()
    default = Schedule("x", "allgather", 3, 2, [], regions=Regions(8))  # contract placement, 2 scratch elements
    assert default.input_range(2) == (4, 6) and default.output_range(0) == (0, 6) and default.work_size == 8
    with pytest.raises(ValueError, match="the output region \\[5, 8\\) does not fit the declared work buffer of 7"):
        Schedule("x", "allreduce", 2, 3, [], regions=Regions(7, input=0, output=5))
    with pytest.raises(ValueError, match="cannot hold the contract's 6-element layout"):
        Schedule("x", "allgather", 3, 2, [], regions=Regions(5))
    with pytest.raises(ValueError, match="Regions.input must be an integer >= 0 or None"):
        Regions(4, input=-1)


def test_block_table_gives_each_member_its_own_blocks():
    sizes = np.array([[2, 0, 3], [1, 4, 1]])  # member m: blocks of sizes[m], laid out contiguously

    def layout(g, m, b):
        starts = np.cumsum(sizes, axis=1) - sizes
        return starts[m, b], sizes[m, b]

    t = BlockTable(layout, 3, sub=2, groups=1)
    assert t.nchunks == 6 and t.length.tolist() == [5]
    start, stop = t.elements(0, np.arange(6), np.arange(1, 7), member=1)
    assert list(zip(start.tolist(), stop.tolist(), strict=True)) == [(0, 1), (1, 1), (1, 3), (3, 5), (5, 6),
                                                                    (6, 6)]
    assert tuple(map(int, t.elements(0, 2, 6, member=0))) == (2, 5)  # blocks 1 and 2 of member 0
    assert tuple(map(int, t.elements(0, 6, 6, member=0))) == (5, 5)  # empty, past the end
    with pytest.raises(ValueError, match="pass member="):
        t.elements(0, 0, 1)


def test_explicit_phase_program_order_and_lanes():
    ops = [[ExplicitOp(0, S, 1, 0, 1, 1), ExplicitOp(0, RR, 1, 1, 1, 0), ExplicitOp(1, S, 0, 0, 1, 0),
            ExplicitOp(1, R, 0, 1, 1, 1)],
           [ExplicitOp(0, S, 0, 0, 1, 1), ExplicitOp(0, RR, 0, 1, 1, 0), ExplicitOp(1, S, 1, 1, 1, 1),
            ExplicitOp(1, R, 1, 0, 1, 1)]]
    phase = explicit_phase("x", ops, ChunkTable.whole(4, 2))
    s = Schedule("x", "allreduce", 2, 2, [phase], regions=Regions(4))
    for node in (0, 1):
        got = [(o.round, o.kind, o.peer, o.start // 2, o.remote // 2) for o in s.program(node)]
        assert got == [(o.round, o.kind, o.peer, o.chunk, o.remote) for o in ops[node]]
    with pytest.raises(ValueError, match="rounds must be >= 0"):
        explicit_phase("x", [[ExplicitOp(-1, S, 0, 0, 1, 0)]], ChunkTable.whole(1, 1))


def test_program_is_linear_with_many_lanes():
    # one_shot's round has 2(p-1) lanes: one lookup per round pattern keeps a program cheap
    s = algorithms.build("one_shot", collective="allreduce", world_size=2048, count=2048)
    prog = s.program(5)
    assert len(prog) == 2 * 2047 and set(prog.kind.tolist()) == {int(S), int(RR)}
