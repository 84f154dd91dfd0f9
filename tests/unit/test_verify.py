"""The verifier: a catalogue of broken schedules it must reject by name, and exact report numbers for ring.

Every broken schedule is built from the IR itself (Phase / Round / slots), the way an algorithm author would
write the mistake, and each test asserts what the error names: the node, its op index, the elements and the
kind of fault.
"""

from __future__ import annotations

import numpy as np
import pytest

from collectives import ScheduleError, algorithms, verify
from collectives.schedule import ChunkTable, Phase, Round, Schedule, recv, recv_reduce, send, split_points


def scripted(p: int, count: int, rounds: list[dict[int, list]], *, collective: str = "allreduce",
             blocks: int = 1, root: int | None = None, groups=None) -> Schedule:
    """One phase over all ranks; round i runs rounds[i][member] (a list of slots; absent member: idle).

    Chunk ids index ChunkTable.whole(work, blocks), so with blocks=1 chunk 0 is the whole work buffer.
    """
    work = count * p if collective == "allgather" else count
    table = ChunkTable.whole(work, blocks)

    def pattern(spec):
        return Round(lambda m, it: spec.get(int(m), []), repeats=1)

    members = np.arange(p) if groups is None else groups
    return Schedule("scripted", collective, p, count, [Phase("scripted", members, table,
                                                              [pattern(r) for r in rounds])], root=root)


def ring_allreduce(p: int, count: int, *, rs_steps: int | None = None, ag_steps: int | None = None,
                   shift: int = 0, owned: int = 1, collective: str = "allreduce") -> Schedule:
    """A one-chunk ring written with vectorizable slots, with knobs to break it (steps, block shifts)."""
    rs_steps = p - 1 if rs_steps is None else rs_steps
    ag_steps = p - 1 if ag_steps is None else ag_steps
    work = count * p if collective == "allgather" else count
    table = ChunkTable.whole(work, p)
    ranks = np.arange(p)
    rounds = []
    if collective in ("allreduce", "reduce_scatter"):
        rounds.append(Round(lambda m, k: [send((m + 1) % p, (m - k + shift) % p),
                                          recv_reduce((m - 1) % p, (m - k - 1 + shift) % p)], repeats=rs_steps))
    if collective in ("allreduce", "allgather"):
        rounds.append(Round(lambda m, j: [send((m + 1) % p, (m + owned - j) % p),
                                          recv((m - 1) % p, (m + owned - j - 1) % p)], repeats=ag_steps))
    return Schedule("test-ring", collective, p, count, [Phase("ring", ranks, table, rounds)])


def rejects(schedule: Schedule, *fragments: str, node=None, op=None, elements=None) -> ScheduleError:
    with pytest.raises(ScheduleError) as info:
        verify(schedule)
    err = info.value
    text = str(err)
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in {text!r}"
    if node is not None:
        assert err.node == node, text
        assert f"node {node}" in text or f"rank {node}" in text, text
    if op is not None:
        assert err.op_index == op, text
    if elements is not None:
        assert err.elements == elements, text
        assert f"[{elements[0]}, {elements[1]})" in text, text
    return err


# -- sanity: the helpers build correct schedules when nothing is broken ------------------------------------

@pytest.mark.parametrize("p", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter", "allgather"])
def test_unbroken_helper_ring_verifies(p, collective):
    shift, owned = (-1, 1) if collective == "reduce_scatter" else (0, 0 if collective == "allgather" else 1)
    count = 2 * p if collective == "reduce_scatter" else 2 * p + 1
    verify(ring_allreduce(p, count, shift=shift, owned=owned, collective=collective))


def test_fused_reduce_of_two_receives_in_one_round_is_legal():
    # node 2 reduce-receives from 0 and 1 in one round: one fused reduction, then broadcasts back
    s = scripted(3, 4, [
        {0: [send(2, 0)], 1: [send(2, 0)], 2: [recv_reduce(0, 0), recv_reduce(1, 0)]},
        {2: [send(0, 0), send(1, 0)], 0: [recv(2, 0)], 1: [recv(2, 0)]},
    ])
    rep = verify(s)
    assert rep.messages == 4 and rep.steps == 2


# -- the catalogue -----------------------------------------------------------------------------------------

def test_double_contribution():
    s = scripted(2, 4, [
        {0: [send(1, 0)], 1: [recv_reduce(0, 0)]},
        {0: [send(1, 0)], 1: [recv_reduce(0, 0)]},  # rank 0's data again
        {1: [send(0, 0)], 0: [recv(1, 0)]},
    ])
    rejects(s, "double contribution", "ranks {0} would be counted twice", "round 1",
            node=1, op=1, elements=(0, 4))


def test_double_contribution_inside_one_fused_round():
    # 1 forwards rank 0's data to 2 while 0 also sends it: 2 would fold rank 0 in twice in one round
    s = scripted(3, 2, [
        {0: [send(1, 0)], 1: [recv(0, 0)]},
        {0: [send(2, 0)], 1: [send(2, 0)], 2: [recv_reduce(0, 0), recv_reduce(1, 0)]},
    ])
    rejects(s, "double contribution", "ranks {0} would be counted twice", node=2, op=1, elements=(0, 2))


def test_missing_contribution_too_few_reduce_scatter_steps():
    # p=4 ring with one reduce-scatter step too few: the allgather then spreads partial blocks
    s = ring_allreduce(4, 8, rs_steps=2)
    rejects(s, "rank 0 ends with wrong data in elements [0, 2) of its allreduce output: holds ranks {3}, "
            "misses ranks {0, 1, 2}; last written by its op 5 in round 2", node=0, op=5, elements=(0, 2))


def test_missing_contribution_one_step_of_three():
    s = ring_allreduce(3, 3, rs_steps=1)
    rejects(s, "rank 0 ends with wrong data in elements [0, 1) of its allreduce output: holds ranks {2}, "
            "misses ranks {0, 1}; last written by its op 3 in round 1", node=0, op=3, elements=(0, 1))


def test_missing_allgather_step():
    # the allgather stops one step early: rank 0's block 2 is left as reduce-scatter left it
    s = ring_allreduce(3, 6, ag_steps=1)
    rejects(s, "rank 0 ends with wrong data in elements [4, 6) of its allreduce output: holds ranks {0, 2}, "
            "misses ranks {1}; last written by its op 1 in round 0", node=0, op=1, elements=(4, 6))


def test_send_without_receive():
    s = scripted(2, 4, [{0: [send(1, 0)]}])
    rejects(s, "send to node 1 has no matching receive on node 1", "(1 sends from 0 to 1, 0 receives)",
            node=0, op=0, elements=(0, 4))


def test_send_without_receive_among_matched_messages():
    # node 0 sends twice to 1, node 1 receives once: the second send is the unmatched one
    s = scripted(2, 4, [
        {0: [send(1, 0)], 1: [recv_reduce(0, 0)]},
        {0: [send(1, 0)]},
    ])
    rejects(s, "has no matching receive", "(2 sends from 0 to 1, 1 receives)", node=0, op=1)


def test_receive_without_send():
    s = scripted(3, 6, [{2: [recv_reduce(1, 0)]}], blocks=3)
    rejects(s, "receive from node 1 has no matching send on node 1", "(0 sends from 1 to 2, 1 receives)",
            node=2, op=0, elements=(0, 2))


def test_mismatched_element_ranges():
    s = scripted(2, 4, [{0: [send(1, 0)], 1: [recv_reduce(0, 1)]}], blocks=2)
    rejects(s, "sends elements [0, 2) but node 1's matching receive (its op 0) expects [2, 4); both ends of a message must name the same two ranges", node=0, op=0, elements=(0, 2))


def test_mismatched_lengths_across_rounds():
    # ranges differ and the rounds differ: the range fault is reported first
    s = scripted(2, 4, [{0: [send(1, 0, 2)]}, {1: [recv(0, 0)]}], blocks=2)
    rejects(s, "sends elements [0, 4) but node 1's matching receive (its op 0) expects [0, 2)", node=0, op=0)


def test_misaligned_rounds_without_deadlock():
    # node 1 has nothing in round 0, so the blocking order completes, but the IR requires same-round pairs
    s = scripted(2, 4, [
        {0: [send(1, 0)]},
        {1: [recv_reduce(0, 0)]},
    ])
    rejects(s, "this message is received by node 1 in round 1 (its op 0)",
            "both ends of a message must be in the same round", node=0, op=0, elements=(0, 4))


def test_deadlock_two_nodes():
    # both receive first and send next round: each waits for a send the other has not reached
    s = scripted(2, 4, [
        {0: [recv(1, 0)], 1: [recv(0, 0)]},
        {0: [send(1, 0)], 1: [send(0, 0)]},
    ])
    err = rejects(s, "deadlock under the blocking order",
                  "node 0 op 0 (round 0) waits for node 1's op 1 in round 1, but node 1 is blocked in round 0",
                  "node 1 op 0 (round 0) waits for node 0's op 1 in round 1, but node 0 is blocked in round 0",
                  node=0, op=0, elements=(0, 4))
    assert str(err).count("waits for") == 2


def test_deadlock_three_node_cycle():
    # vectorizable slots: member m receives from m-1 in round 0 but everyone sends only in round 1
    p = 3
    table = ChunkTable.whole(6, 1)
    phase = Phase("cycle", np.arange(p), table, [
        Round(lambda m, it: [recv((m - 1) % p, 0)]),
        Round(lambda m, it: [send((m + 1) % p, 0)]),
    ])
    err = rejects(Schedule("cycle", "allreduce", p, 6, [phase]), "deadlock under the blocking order",
                  "node 0 op 0 (round 0) waits for node 2's op 1 in round 1, but node 2 is blocked in round 0",
                  "node 2 op 0 (round 0) waits for node 1's op 1 in round 1, but node 1 is blocked in round 0",
                  "node 1 op 0 (round 0) waits for node 0's op 1 in round 1, but node 0 is blocked in round 0",
                  node=0, op=0)
    assert str(err).count("waits for") == 3


def test_deadlock_cycle_among_other_nodes_is_isolated():
    # nodes 0 and 1 exchange correctly; nodes 2 and 3 deadlock: only 2 and 3 are named
    s = scripted(4, 2, [
        {0: [send(1, 0)], 1: [recv_reduce(0, 0)], 2: [recv(3, 0)], 3: [recv(2, 0)]},
        {1: [send(0, 0)], 0: [recv(1, 0)], 2: [send(3, 0)], 3: [send(2, 0)]},
    ])
    err = rejects(s, "deadlock", "node 2 op 0", "node 3 op 0", node=2, op=0)
    assert "node 0 op" not in str(err) and "node 1 op" not in str(err)


def test_message_to_nonexistent_node():
    # the group lists node 2, but the schedule has only nodes 0 and 1
    s = scripted(2, 4, [{0: [send(2, 0)]}], groups=np.array([0, 1, 2]))
    rejects(s, "peer 2 does not exist (nodes are 0..1)", node=0, op=0, elements=(0, 4))


def test_message_to_padding_member():
    # member 2 of the group is padding (-1): the message has nobody to go to
    s = scripted(2, 4, [{1: [send(2, 0)]}], groups=np.array([0, 1, -1]))
    rejects(s, "peer -1 does not exist", node=1, op=0, elements=(0, 4))


def test_peer_member_outside_the_group():
    # `m + 1` without `% p`: the last member names member p, which the group does not have
    p = 3
    phase = Phase("ring", np.arange(p), ChunkTable.whole(3, 1),
                  [Round(lambda m, it: [send(m + 1, 0), recv((m - 1) % p, 0)])])
    err = rejects(Schedule("bad", "allreduce", p, 3, [phase]), "node 2", "names peer member 3",
                  "its group has members 0..2", node=2)
    assert err.round == 0


def test_message_to_self_is_a_local_copy():
    exchange = {0: [send(1, 0), recv(1, 1)], 1: [send(0, 1), recv(0, 0)]}
    same_place = {1: [send(1, 1), recv(1, 1)]}  # rank 1 copies its block 1 onto itself: harmless
    report = verify(scripted(2, 2, [exchange, same_place], collective="allgather", blocks=2))
    assert report.local_steps == 1 and report.messages == 2
    wrong_place = {1: [send(1, 0, remote=1), recv(1, 1, remote=0)]}  # block 0 copied over block 1
    rejects(scripted(2, 2, [exchange, wrong_place], collective="allgather", blocks=2),
            "rank 1 ends with wrong data in elements [2, 4) of its allgather output: holds ranks {0}, misses "
            "ranks {1} and also holds ranks {0}; last written by its op 3 in round 1; expected rank 1's input elements [0, 2)", node=1, op=3)


def test_message_to_self_without_its_receive():
    s = scripted(2, 4, [{0: [send(1, 0)], 1: [recv_reduce(0, 0)]}, {1: [send(1, 0)]}])
    rejects(s, "send to node 1 has no matching receive on node 1", "round 1", node=1, op=1, elements=(0, 4))


def test_range_outside_the_buffer():
    table = ChunkTable([2], [4], 2)  # elements [2, 6) of a 4-element buffer
    phase = Phase("oob", np.arange(2), table, [Round(lambda m, it: [send((m + 1) % 2, 1), recv((m + 1) % 2, 1)])])
    rejects(Schedule("oob", "allreduce", 2, 4, [phase]), "element range outside the work buffer [0, 4)",
            node=0, op=0, elements=(4, 6))


def test_reduce_of_undefined_payload():
    # broadcast: only the root's buffer is defined; rank 1 sends its undefined buffer to be reduced
    s = scripted(2, 4, [{1: [send(0, 0)], 0: [recv_reduce(1, 0)]}], collective="broadcast", root=0)
    rejects(s, "reduces data that node 1 never defined", node=0, op=0, elements=(0, 4))


def test_reduce_into_undefined_local_data():
    s = scripted(2, 4, [{0: [send(1, 0)], 1: [recv_reduce(0, 0)]}], collective="broadcast", root=0)
    rejects(s, "reduces into local elements that were never defined", node=1, op=0, elements=(0, 4))


def test_reduce_into_undefined_allgather_block():
    # allgather: rank 1 only holds block 1; reducing into block 0 touches memory nobody wrote
    s = scripted(2, 2, [{0: [send(1, 0)], 1: [recv_reduce(0, 0)]}], collective="allgather", blocks=2)
    rejects(s, "never defined", node=1, op=0, elements=(0, 2))


def test_allgather_delivers_the_wrong_block():
    # allgather ring that believes each rank starts owning block r+1: it forwards blocks nobody has yet
    s = ring_allreduce(3, 2, owned=1, collective="allgather")
    rejects(s, "rank 0 ends with wrong data in elements [0, 2) of its allgather output: holds no rank + undefined "
            "data, misses ranks {0}", "last written by its op 1 in round 0", node=0, op=1, elements=(0, 2))


def test_allgather_one_block_never_delivered():
    # p=2: rank 0 sends its block to 1, but rank 1's block never reaches rank 0
    s = scripted(2, 3, [{0: [send(1, 0)], 1: [recv(0, 0)]}], collective="allgather", blocks=2)
    rejects(s, "rank 0 ends with wrong data in elements [3, 6) of its allgather output",
            "holds no rank + undefined data", "misses ranks {1}", "never written by the schedule",
            node=0, elements=(3, 6))


def test_broadcast_not_reaching_a_rank():
    s = scripted(3, 5, [{0: [send(1, 0)], 1: [recv(0, 0)]}], collective="broadcast", root=0)
    err = rejects(s, "rank 2 ends with wrong data in elements [0, 5) of its broadcast output",
                  "misses ranks {0}", "never written by the schedule", node=2, elements=(0, 5))
    assert err.op_index is None


def test_reduce_scatter_leaves_the_wrong_block():
    # the allreduce shift (0) instead of reduce_scatter's (-1): rank r ends with block r+1, not block r
    p, k = 4, 2
    s = ring_allreduce(p, p * k, shift=0, collective="reduce_scatter")
    err = rejects(s, "rank 0 ends with wrong data in elements [0, 2) of its reduce_scatter output: holds ranks {0}, "
                  "misses ranks {1, 2, 3}; never written by the schedule", node=0, elements=(0, 2))
    assert err.op_index is None


def test_store_after_reduce_in_the_same_round():
    s = scripted(3, 2, [{0: [send(2, 0)], 1: [send(2, 0)], 2: [recv_reduce(0, 0), recv(1, 0)]}])
    rejects(s, "stores into elements that another receive of the same round already writes",
            node=2, op=1, elements=(0, 2))


def test_store_after_store_in_the_same_round():
    s = scripted(3, 2, [{0: [send(2, 0)], 1: [send(2, 0)], 2: [recv(0, 0), recv(1, 0)]}])
    rejects(s, "stores into elements that another receive of the same round already writes",
            node=2, op=1, elements=(0, 2))


def test_error_attributes_are_a_schedule_error():
    with pytest.raises(ScheduleError) as info:
        verify(scripted(2, 4, [{0: [send(1, 0)]}]))
    assert info.value.round == 0


# -- report numbers for ring -------------------------------------------------------------------------------

def block_lengths(n: int, p: int) -> np.ndarray:
    b = np.arange(p + 1)
    return np.diff(split_points(n, p, b))


@pytest.mark.parametrize("p", [1, 2, 3, 4, 7, 16, 33])
@pytest.mark.parametrize("count", [0, 1, 5, 100, 1001])
@pytest.mark.parametrize("itemsize", [1, 4])
def test_ring_allreduce_report(p, count, itemsize):
    rep = verify(algorithms.build("ring", collective="allreduce", world_size=p, count=count), itemsize=itemsize)
    blen = block_lengths(count, p)
    r = np.arange(p)
    # reduce-scatter: rank r sends every block but r+1 and receives every block but r;
    # allgather (owning r+1): sends every block but r+2, receives every block but r+1
    sent = 2 * count - blen[(r + 1) % p] - blen[(r + 2) % p]
    received = 2 * count - blen[r] - blen[(r + 1) % p]
    if p == 1:
        sent = received = np.zeros(1, np.int64)
    assert rep.steps == 2 * (p - 1)
    assert rep.messages == p * 2 * (p - 1)  # each rank sends 2(p-1) messages
    np.testing.assert_array_equal(rep.bytes_sent, sent * itemsize)
    np.testing.assert_array_equal(rep.bytes_received, received * itemsize)
    assert rep.bytes_sent.sum() == rep.bytes_received.sum()
    assert rep.max_bytes_sent_per_rank == int(sent.max(initial=0)) * itemsize
    if count % p == 0:  # the bandwidth-optimal 2(p-1)/p of the buffer
        assert (rep.bytes_sent == 2 * (p - 1) * (count // p) * itemsize).all()


@pytest.mark.parametrize("p", [2, 3, 8])
@pytest.mark.parametrize("chunks", [1, 2, 3])
def test_ring_pipelined_report(p, chunks):
    count = 10 * p + 3
    rep = verify(algorithms.build("ring", collective="allreduce", world_size=p, count=count, chunks=chunks))
    assert rep.messages == p * 2 * (p - 1) * chunks
    assert rep.steps == 2 * (p - 1 + chunks - 1)
    blen = block_lengths(count, p)
    r = np.arange(p)
    np.testing.assert_array_equal(rep.bytes_sent, (2 * count - blen[(r + 1) % p] - blen[(r + 2) % p]) * 4)


@pytest.mark.parametrize("p", [1, 2, 5, 12])
def test_ring_reduce_scatter_and_allgather_reports(p):
    k = 3
    rs = verify(algorithms.build("ring", collective="reduce_scatter", world_size=p, count=p * k), itemsize=8)
    assert rs.steps == p - 1 and rs.messages == p * (p - 1)
    assert (rs.bytes_sent == (p - 1) * k * 8).all() and (rs.bytes_received == (p - 1) * k * 8).all()
    ag = verify(algorithms.build("ring", collective="allgather", world_size=p, count=k), itemsize=2)
    assert ag.steps == p - 1 and ag.messages == p * (p - 1)
    assert (ag.bytes_sent == (p - 1) * k * 2).all() and (ag.bytes_received == (p - 1) * k * 2).all()


def test_report_summary_and_shape():
    rep = verify(algorithms.build("ring", collective="allreduce", world_size=4, count=8))
    assert rep.summary() == "ring allreduce p=4 count=8: OK, 6 steps, 24 messages, max 48 B sent per rank"
    assert rep.bytes_sent.shape == (4,) and rep.num_nodes == 4
