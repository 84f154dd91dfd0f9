"""The schedule IR: chunk tables, phases, per-node programs (order and cost), and the registry's errors."""

from __future__ import annotations

import dataclasses
import sys
import time
import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collectives import algorithms, registry, verify
from collectives.schedule import (
    ChunkTable,
    OpKind,
    Phase,
    Round,
    Schedule,
    recv,
    recv_reduce,
    send,
    split_points,
)

# -- chunk tables ------------------------------------------------------------------------------------------

def spans(table: ChunkTable, group: int = 0) -> list[tuple[int, int]]:
    ids = np.arange(table.nchunks)
    start, stop = table.elements(group, ids, ids + 1)
    return list(zip(np.asarray(start).tolist(), np.asarray(stop).tolist(), strict=True))


def test_split_points_first_parts_get_the_remainder():
    assert [int(split_points(10, 3, i)) for i in range(4)] == [0, 4, 7, 10]
    np.testing.assert_array_equal(split_points(10, 3, np.arange(4)), [0, 4, 7, 10])
    assert [int(split_points(2, 5, i)) for i in range(6)] == [0, 1, 2, 2, 2, 2]


def test_one_level_table():
    t = ChunkTable.whole(10, 3)
    assert t.nchunks == 3
    assert spans(t) == [(0, 4), (4, 7), (7, 10)]
    assert tuple(map(int, t.elements(0, 0, 3))) == (0, 10)


def test_two_level_table_keeps_block_boundaries():
    t = ChunkTable.whole(10, 3, sub=2)  # blocks 4, 3, 3; each split in two
    assert t.nchunks == 6
    assert spans(t) == [(0, 2), (2, 4), (4, 6), (6, 7), (7, 9), (9, 10)]
    # chunk b*sub starts exactly at block b's boundary
    assert [int(t.elements(0, b * 2, b * 2 + 1)[0]) for b in range(3)] == [0, 4, 7]
    # a range of chunk ids across blocks is one contiguous element range
    assert tuple(map(int, t.elements(0, 1, 4))) == (2, 7)


def test_empty_chunks_are_legal():
    t = ChunkTable.whole(2, 5, sub=3)
    s = spans(t)
    lengths = [b - a for a, b in s]
    assert sum(lengths) == 2 and min(lengths) == 0 and all(x >= 0 for x in lengths)
    assert s[0][0] == 0 and s[-1][1] == 2
    assert all(s[i][1] == s[i + 1][0] for i in range(len(s) - 1))
    zero = ChunkTable.whole(0, 4, sub=2)
    assert spans(zero) == [(0, 0)] * 8


def test_per_group_offsets_and_vectorized_lookup():
    t = ChunkTable([0, 100, 50], [10, 7, 0], blocks=2)
    assert spans(t, 1) == [(100, 104), (104, 107)]
    assert spans(t, 2) == [(50, 50), (50, 50)]
    start, stop = t.elements(np.array([0, 1, 1]), np.array([0, 0, 1]), np.array([2, 1, 2]))
    assert start.tolist() == [0, 100, 104] and stop.tolist() == [10, 104, 107]


def test_whole_with_groups():
    t = ChunkTable.whole(9, 3, groups=4)
    assert t.offset.tolist() == [0] * 4 and t.length.tolist() == [9] * 4
    assert spans(t, 3) == [(0, 3), (3, 6), (6, 9)]


def test_invalid_tables():
    with pytest.raises(ValueError, match="at least one block and one sub-chunk, got 0 x 1"):
        ChunkTable.whole(4, 0)
    with pytest.raises(ValueError, match="at least one block and one sub-chunk, got 2 x 0"):
        ChunkTable.whole(4, 2, sub=0)
    with pytest.raises(ValueError, match="lengths must be >= 0"):
        ChunkTable([0], [-1], 1)


@settings(max_examples=300, deadline=None)
@given(offset=st.integers(0, 1000), length=st.integers(0, 300), blocks=st.integers(1, 40), sub=st.integers(1, 6))
def test_chunk_table_tiles_its_range(offset, length, blocks, sub):
    t = ChunkTable([offset], [length], blocks, sub)
    s = spans(t)
    assert s[0][0] == offset and s[-1][1] == offset + length
    assert all(s[i][1] == s[i + 1][0] for i in range(len(s) - 1))  # contiguous, in order
    lengths = np.array([b - a for a, b in s])
    assert lengths.sum() == length and (lengths >= 0).all()
    block_len = lengths.reshape(blocks, sub).sum(axis=1)
    assert block_len.max() - block_len.min() <= 1  # near-equal blocks, the longer ones first
    assert (np.diff(block_len) <= 0).all()
    for b in range(blocks):  # sub-chunks of a block are near-equal too
        seg = lengths[b * sub:(b + 1) * sub]
        assert seg.max() - seg.min() <= 1 and (np.diff(seg) <= 0).all()


# -- phases ------------------------------------------------------------------------------------------------

def test_locate_with_padding():
    ph = Phase("x", np.array([[0, 1, 2], [3, 4, -1]]), ChunkTable.whole(4, 1, groups=2), [])
    assert ph.locate(0) == (0, 0) and ph.locate(4) == (1, 1) and ph.locate(2) == (0, 2)
    assert ph.locate(5) is None and ph.locate(-1) is None
    assert ph.group_size == 3 and ph.num_rounds == 0


def test_locate_transposed_groups():
    ranks = np.arange(12).reshape(3, 4)  # 3 groups of 4; the transpose: 4 groups of 3 (same local index)
    ph = Phase("x", ranks.T, ChunkTable.whole(4, 1, groups=4), [])
    for r in range(12):
        assert ph.locate(r) == (r % 4, r // 4)


def test_locate_rejects_a_node_in_two_slots():
    ph = Phase("dup", np.array([[0, 1], [1, 2]]), ChunkTable.whole(4, 1, groups=2), [])
    with pytest.raises(ValueError, match="phase 'dup': a node appears in more than one group slot"):
        ph.locate(0)


def test_negative_repeats_rejected():
    with pytest.raises(ValueError, match="cannot repeat -1 times"):
        Phase("x", np.arange(2), ChunkTable.whole(2, 1), [Round(lambda m, it: [], repeats=-1)])


# -- programs ----------------------------------------------------------------------------------------------

def test_ring_program_order_and_content():
    p, n = 5, 10
    s = algorithms.build("ring", collective="allreduce", world_size=p, count=n)
    for r in range(p):
        prog = s.program(r)
        assert len(prog) == 4 * (p - 1)
        assert (np.diff(prog.round) >= 0).all()
        ops = list(prog)
        assert [o.kind for o in ops] == [OpKind.SEND, OpKind.RECV_REDUCE] * (p - 1) + [OpKind.SEND, OpKind.RECV] * (p - 1)
        assert [o.round for o in ops[::2]] == list(range(2 * (p - 1)))
        assert all(o.peer == (r + 1) % p for o in ops[::2]) and all(o.peer == (r - 1) % p for o in ops[1::2])
        assert ops[0] == prog[0] and prog[0].describe().startswith("round 0: send to node")


def test_program_rounds_are_global_across_phases_and_skip_absent_nodes():
    # phase A: ranks 0,1 exchange (2 rounds); phase B: ranks 2,3 exchange (1 round), then all four (1 round)
    t = ChunkTable.whole(4, 2, groups=2)

    def swap(m, it):
        return [send(1 - m, 0), recv_reduce(1 - m, 0)]

    a = Phase("A", np.array([[0, 1]]), ChunkTable.whole(4, 2), [Round(swap, repeats=2)])
    b = Phase("B", np.array([[2, 3], [-1, -1]]), t, [Round(swap), Round(lambda m, it: [send(-1, 0)])])
    s = Schedule("t", "allreduce", 4, 4, [a, b])
    assert s.num_rounds == 4 and [base for _, base in s.phase_rounds()] == [0, 2]
    assert s.program(0).round.tolist() == [0, 0, 1, 1]
    assert s.program(2).round.tolist() == [2, 2]  # idle slots (peer -1) make no operation
    assert [o.kind for o in s.program(3)] == [OpKind.SEND, OpKind.RECV_REDUCE]
    assert "phase 'B': rounds 2..3, 2 group(s) of 2" in s.describe()


def test_slot_order_within_a_round_is_program_order():
    s = Schedule("t", "allreduce", 3, 6, [Phase("x", np.arange(3), ChunkTable.whole(6, 3), [Round(
        lambda m, it: [recv((m + 1) % 3, 0), recv_reduce((m + 2) % 3, 0), send((m + 1) % 3, 0),
                       send((m + 2) % 3, 0)])])])
    kinds = [o.kind for o in s.program(0)]
    assert kinds == [OpKind.RECV, OpKind.RECV_REDUCE, OpKind.SEND, OpKind.SEND]
    assert [o.peer for o in s.program(0)] == [1, 2, 1, 2]


def test_program_node_out_of_range():
    s = algorithms.build("ring", collective="allreduce", world_size=3, count=3)
    with pytest.raises(ValueError, match=r"node must be in \[0, 3\), got 3"):
        s.program(3)


def test_single_rank_has_an_empty_program():
    s = algorithms.build("ring", collective="allreduce", world_size=1, count=5)
    assert len(s.program(0)) == 0 and list(s.program(0).rounds()) == []


def test_a_schedule_keeps_its_expansion_until_its_parts_change():
    """expand() keeps its table on the schedule for the next executor, read-only, equal to the programs; a
    schedule whose phases or rounds are replaced expands anew."""
    from collectives.schedule.expand import expand, node_programs

    s = algorithms.build("ring", collective="allreduce", world_size=4, count=13, chunks=2)
    t = expand(s)
    assert expand(s) is t and not t.start.flags.writeable
    with pytest.raises(ValueError):
        t.start[0] = 1
    for n, prog in enumerate(node_programs(s)):
        assert list(prog) == list(s.program(n))
    before = len(t)
    s.phases = s.phases + s.phases  # the ring twice
    assert expand(s) is not t and len(expand(s)) == 2 * before
    phase = s.phases[0]  # (both phases)
    phase.rounds = [dataclasses.replace(phase.rounds[0], repeats=1)]
    shorter = expand(s)
    assert len(shorter) < 2 * before and expand(s) is shorter


def test_a_large_expansion_is_not_kept(monkeypatch):
    from collectives.schedule import expand as expand_module

    monkeypatch.setattr(expand_module, "KEEP_MAX_OPS", 10)
    s = algorithms.build("ring", collective="allreduce", world_size=4, count=13)
    assert len(expand_module.expand(s)) > 10 and s._expansion is None
    assert expand_module.expand(s) is not expand_module.expand(s)


@pytest.mark.parametrize("p", [2, 3, 7])
@pytest.mark.parametrize("chunks", [1, 3])
def test_slots_vectorize_over_members(p, chunks):
    """The same slot function, called once with every member, gives exactly the per-node programs."""
    s = algorithms.build("ring", collective="allreduce", world_size=p, count=4 * p + 1, chunks=chunks)
    progs = [s.program(r) for r in range(p)]
    base = 0
    for phase in s.phases:
        for rnd in phase.rounds:
            for it in range(rnd.repeats):
                slots = rnd.slots(np.arange(p), it)
                for r in range(p):
                    mine = [o for o in progs[r] if o.round == base + it]
                    want = []
                    for sl in slots:
                        peer = np.broadcast_to(sl.peer, (p,))[r]
                        if peer < 0:
                            continue
                        lo = int(np.broadcast_to(sl.chunk, (p,))[r])
                        nc = int(np.broadcast_to(sl.nchunks, (p,))[r])
                        a, b = phase.chunks.elements(0, lo, lo + nc)
                        want.append((sl.kind, int(phase.groups[0][peer]), int(a), int(b)))
                    assert [(o.kind, o.peer, o.start, o.stop) for o in mine] == want
            base += rnd.repeats


def test_one_rank_of_a_331776_rank_ring_builds_alone():
    p = 331_776
    t0 = time.perf_counter()
    s = algorithms.build("ring", collective="allreduce", world_size=p, count=p)
    prog = s.program(12_345)
    elapsed = time.perf_counter() - t0
    assert len(prog) == 4 * (p - 1)  # 2(p-1) sends and 2(p-1) receives
    assert int((prog.kind == OpKind.SEND).sum()) == 2 * (p - 1)
    assert prog.round[-1] == 2 * (p - 1) - 1
    assert elapsed < 5.0, f"one rank's program took {elapsed:.2f} s"


# -- registry ----------------------------------------------------------------------------------------------

@pytest.fixture
def scratch_name():
    name = "test-scratch-algorithm"
    yield name
    registry._REGISTRY.pop(name, None)


def test_unknown_algorithm_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown algorithm 'nope'; valid algorithms: .*\bring\b"):
        algorithms.build("nope", collective="allreduce", world_size=2, count=2)
    with pytest.raises(ValueError, match="unknown algorithm 'nope'"):
        algorithms.info("nope")


def test_unsupported_collective_lists_what_it_implements():
    with pytest.raises(ValueError, match=r"algorithm 'ring' does not implement broadcast; it implements "
                                         r"allreduce, reduce_scatter, allgather; algorithms for broadcast:"):
        algorithms.build("ring", collective="broadcast", world_size=2, count=2)


def test_unknown_collective():
    with pytest.raises(ValueError, match=r"unknown collective 'gather'; valid collectives: allreduce, "
                                         r"reduce_scatter, allgather, broadcast, reduce, alltoall, alltoallv"):
        algorithms.build("ring", collective="gather", world_size=2, count=2)
    with pytest.raises(ValueError, match="unknown collective 'gather'"):
        algorithms.names("gather")


def test_root_on_a_non_rooted_collective():
    with pytest.raises(ValueError, match=r"allreduce takes no root \(got root=0\)"):
        algorithms.build("ring", collective="allreduce", world_size=2, count=2, root=0)


def test_reduce_scatter_count_must_divide():
    with pytest.raises(ValueError, match=r"must divide by world_size=4; got count=10"):
        algorithms.build("ring", collective="reduce_scatter", world_size=4, count=10)


BAD_SHAPES = [
    (0, 4, "world_size must be an integer >= 1, got 0"),
    (2, -1, "count must be an integer >= 0"),
]


@pytest.mark.parametrize("world_size, count, message", BAD_SHAPES)
def test_bad_shapes_in_schedule(world_size, count, message):
    with pytest.raises(ValueError, match=message):
        Schedule("t", "allreduce", world_size, count, [])


@pytest.mark.parametrize("world_size, count, message", BAD_SHAPES)
def test_bad_shapes_through_build(world_size, count, message):
    with pytest.raises(ValueError, match=message):
        algorithms.build("ring", collective="allreduce", world_size=world_size, count=count)


def test_unknown_parameter_names_the_valid_ones():
    with pytest.raises(ValueError, match=r"algorithm 'ring' has no parameter 'chunk'; its parameters: chunks"):
        algorithms.build("ring", collective="allreduce", world_size=2, count=2, chunk=4)


def test_ring_rejects_bad_chunks():
    with pytest.raises(ValueError, match=r"ring chunks \(pipeline segments\) must be an integer >= 1, got 0"):
        algorithms.build("ring", collective="allreduce", world_size=2, count=2, chunks=0)


def test_names_filters_by_collective():
    assert "ring" in algorithms.names("allreduce") and "ring" in algorithms.names()
    assert "ring" not in algorithms.names("broadcast")


def test_register_verify_and_duplicate(scratch_name):
    @registry.register(scratch_name, ("allreduce",), summary="two ranks swap and reduce")
    def build(collective, world_size, count, *, root=None, topology=None):
        swap = Round(lambda m, it: [send(1 - m, 0), recv_reduce(1 - m, 0)])
        return Schedule(scratch_name, collective, world_size, count,
                        [Phase("swap", np.arange(world_size), ChunkTable.whole(count, 1), [swap])])

    assert scratch_name in algorithms.names("allreduce")
    assert algorithms.info(scratch_name).summary == "two ranks swap and reduce"
    rep = verify(algorithms.build(scratch_name, collective="allreduce", world_size=2, count=3))
    assert rep.messages == 2
    registry.register(scratch_name, ("allreduce",))(build)  # the same builder again (a re-import): fine

    def other(collective, world_size, count, *, root=None, topology=None):
        raise AssertionError("never built")

    with pytest.raises(ValueError, match=rf"algorithm '{scratch_name}' is already registered; pass replace=True"):
        registry.register(scratch_name, ("allreduce",))(other)
    before = registry.generation()
    registry.register(scratch_name, ("allreduce",), replace=True)(other)
    assert algorithms.info(scratch_name).builder is other
    assert registry.generation() > before  # the communicator's cache of auto choices keys on it


def test_register_rejects_unknown_collective(scratch_name):
    with pytest.raises(ValueError, match="unknown collective 'allreduc'"):
        registry.register(scratch_name, ("allreduc",))


def test_entry_point_modules_are_imported_once(scratch_name, monkeypatch, tmp_path):
    mod = tmp_path / "scratch_algorithm_plugin.py"
    mod.write_text(
        "from collectives.registry import register\n"
        f"@register({scratch_name!r}, ('allgather',))\n"
        "def build(collective, world_size, count, *, root=None, topology=None):\n"
        "    '''A plugin builder.'''\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    calls = []

    def fake_entry_points(*, group):
        calls.append(group)
        return [types.SimpleNamespace(name=scratch_name, value="scratch_algorithm_plugin:build")]

    monkeypatch.setattr(registry, "entry_points", fake_entry_points)
    monkeypatch.setattr(registry, "_entry_points_loaded", False)
    monkeypatch.delitem(sys.modules, "scratch_algorithm_plugin", raising=False)
    assert scratch_name in algorithms.names("allgather")
    assert algorithms.info(scratch_name).summary == "A plugin builder."
    algorithms.names()
    assert calls == ["collectives.algorithms"]
