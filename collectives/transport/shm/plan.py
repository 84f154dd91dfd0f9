"""A rank's shared-memory plan: what the shared-memory executor (executor.py) does in each round of a schedule,
decided once per schedule and rank, without MPI.

Which fused landings a round makes (a store is one copy; a run of reduce-receives of one range is ONE fused
reduce over the local value and every sender's range), which ranges the rank's window must mirror and when
(copied in before their first read, or copied work -> window after the write that precedes a later read),
and which counters each step waits for (data: the sender's `done`; write-after-read: the readers' `read`).
program.py lowers a plan to the one instruction stream that the C plan runner and its Python interpreter
both execute.

Counters: each rank publishes `done` (its mirror holds the state at the start of round k once done >= base +
1 + k) and `read` (it has finished reading peers' windows for rounds <= k once read >= base + 2 + k).
* data: before reading node q's range in round k, wait for done[q] >= base + 1 + k;
* write-after-read: before writing a mirror range that node q reads in round j <= k (same round included,
  e.g. recursive doubling, where the landing into the private work buffer goes first), wait for
  read[q] >= base + 2 + j. Landing never waits for readers: the work buffer is private.
A call takes 1 + num_rounds counter steps on every rank, so all counters meet at the same base between calls;
the first window write of a call waits for read[q] >= base on every peer (nobody still reads the last call).
Round semantics (ops.py: sends read the round-start state, writes land at round end) hold exactly.

Single-copy messages (`direct_messages`): a message of at least the arena's `single_copy_min` bytes whose range
the sender never writes during the call, landed by a plain store, is read by the receiver straight from the
sender's memory (csrc/plan.h, PEER_READ) instead of through the sender's window: one copy instead of two (a
message a rank sends itself, e.g. an alltoall's own block, is then one local copy). The sender leaves it out of
its window and waits, before its call returns, until those readers are done
(`readers`): its input stays unchanged until then. Every rank derives the same set from the schedule alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...schedule import Op, OpKind, Schedule


# -- the plan: rounds with their waits, built once per schedule and rank ----------------------------------
def _merge(ranges) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for a, b in sorted(r for r in ranges if r[1] > r[0]):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _covered(a: int, b: int, merged: list[tuple[int, int]]) -> bool:
    return any(c <= a and b <= d for c, d in merged)


def _unwritten(a: int, b: int, merged: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of [a, b) outside the merged (sorted, disjoint) ranges."""
    parts, lo = [], a
    for c, d in merged:
        if d <= lo or c >= b:
            continue
        if c > lo:
            parts.append((lo, c))
        lo = max(lo, d)
        if lo >= b:
            break
    if lo < b:
        parts.append((lo, b))
    return parts


def direct_messages(schedule: Schedule, itemsize: int, min_bytes: int) -> frozenset[tuple[int, int, int, int]]:
    """(round, sender, receiver, sender's start) of the messages read straight from the sender's memory: at
    least `min_bytes` (0: none), a range the sender never writes during the call (so its value is the input,
    or the state it had before the call, until the call ends), stored by the receiver as it is (a reduce reads
    its operands from the sender's window). The same on every rank."""
    min_len = -(-min_bytes // itemsize) if min_bytes > 0 else 0
    if min_len <= 0 or schedule.work_size < min_len:  # no message can be that long: skip every rank's program
        return frozenset()
    programs = [schedule.program(v) for v in range(schedule.world_size)]
    written = []
    stores = set()  # (round, receiver, sender, sender's start, length) of every plain store
    for v, prog in enumerate(programs):
        writes = []
        for o in prog:
            if o.kind != OpKind.SEND:
                writes.append((o.start, o.stop))
                if o.kind == OpKind.RECV and o.stop - o.start >= min_len:
                    stores.add((o.round, v, o.peer, o.remote, o.stop - o.start))
        written.append(_merge(writes))
    return frozenset((o.round, v, o.peer, o.start) for v, prog in enumerate(programs) for o in prog
                     if o.kind == OpKind.SEND and (o.round, o.peer, v, o.start, o.stop - o.start) in stores
                     and not any(a < o.stop and o.start < b for a, b in written[v]))


@dataclass
class _Round:
    k: int  # global round index
    groups: list[list[Op]]  # land_receives' fused runs, program order
    data_waits: list[tuple[int, int]]  # (peer, offset): done[peer] >= base + offset before reading it
    mirror: list[tuple[int, int]]  # ranges copied work -> window after landing (peers read them later)
    mirror_waits: list[tuple[int, int]]  # (peer, offset): read[peer] >= base + offset before the mirror copy
    advance_to: int  # offset from base both counters take once the round is finished
    copy_next: list[tuple[int, int]]  # input ranges first read by peers in the next active round: copy in now
    # Lazy input (the caller's x is not copied into the work buffer up front): for each group, the parts of its
    # target not written before it (a reduce reads the node's value there from x); copy_next cut into parts
    # (lo, hi, unwritten: copy from x rather than from work)
    fresh: list[list[tuple[int, int]]]
    copy_next_parts: list[tuple[int, int, bool]]


@dataclass
class ShmPlan:
    node: int
    total: int  # counter steps per call: 1 + num_rounds
    rounds: list[_Round]
    copy_in: list[tuple[int, int]]  # input ranges peers read in the first active round (copied at the start)
    start_offset: int  # counters after the copy-in: 1 + first active round (or total)
    work_size: int
    never_written: list[tuple[int, int]]  # ranges no round writes: copied from x at the end (lazy input)
    world_size: int
    direct: frozenset = frozenset()  # direct_messages(): (round, sender, receiver, sender's start)
    readers: tuple[int, ...] = ()  # the receivers of this node's single-copy messages (waited for at the end)
    direct_ranges: tuple[tuple[int, int], ...] = ()  # the ranges this node sends as single-copy messages

    @property
    def writes_window(self) -> bool:
        return bool(self.copy_in) or any(r.mirror or r.copy_next for r in self.rounds)

    @classmethod
    def build(cls, schedule: Schedule, node: int, direct: frozenset = frozenset()) -> ShmPlan:
        """`direct`: the schedule's single-copy messages (direct_messages), which never pass through a window."""
        R = schedule.num_rounds
        active: list[tuple[int, list[Op]]] = []
        readers, direct_ranges = set(), []
        for rnd, ops in schedule.program(node).rounds():
            ops = [o for _, o in ops if o.stop > o.start]
            for o in ops:
                if o.kind == OpKind.SEND and (rnd, node, o.peer, o.start) in direct:
                    direct_ranges.append((o.start, o.stop))
                    if o.peer != node:  # a message to itself is a local copy (program.py)
                        readers.add(o.peer)
            # a single-copy message is no send of this rank's window (the receiver reads this rank's memory)
            ops = [o for o in ops if o.kind != OpKind.SEND or (rnd, node, o.peer, o.start) not in direct]
            if ops:
                active.append((rnd, ops))
        sends = [(k, o.peer, o.start, o.stop) for k, ops in active for o in ops if o.kind == OpKind.SEND]
        # the window must hold a range's current value whenever a peer reads it: at the start for ranges sent
        # before this rank writes them, and after every write of a range that is sent in a later round
        # (copied in lazily: just before the counters announce the round of their first send, so a large call
        # streams through the caches chunk by chunk instead of copying everything up front)
        copy_in, written, exposed = [], [], []
        for _k, ops in active:
            merged, shown = _merge(written), _merge(exposed)
            fresh = [(o.start, o.stop) for o in ops if o.kind == OpKind.SEND
                     and not _covered(o.start, o.stop, merged) and not _covered(o.start, o.stop, shown)]
            copy_in.append(_merge(fresh))
            exposed += fresh
            written += [(o.start, o.stop) for o in ops if o.kind != OpKind.SEND]
        rounds = []
        written_so_far: list[tuple[int, int]] = []
        for i, (k, ops) in enumerate(active):
            recvs = [o for o in ops if o.kind != OpKind.SEND]
            data: dict[int, int] = {}
            for o in recvs:
                data[o.peer] = 1 + k
            groups: list[list[Op]] = []
            j = 0
            while j < len(recvs):
                first = recvs[j]
                e = j + 1
                while e < len(recvs) and recvs[e].kind == OpKind.RECV_REDUCE and recvs[e].start == first.start \
                        and recvs[e].stop == first.stop:
                    e += 1
                groups.append(recvs[j:e])
                j = e
            mirror = _merge((o.start, o.stop) for o in recvs
                            if any(j > k and a < o.stop and o.start < b for j, _, a, b in sends))
            waits: dict[int, int] = {}
            for a, b in mirror:  # write-after-read: peers that read this range earlier (or this round) are done
                for j, q, c, d in sends:
                    if j <= k and c < b and a < d:
                        waits[q] = max(waits.get(q, 0), 2 + j)
            nxt = 1 + active[i + 1][0] if i + 1 < len(active) else 1 + R
            pre = copy_in[i + 1] if i + 1 < len(active) else []
            fresh = []
            for g in groups:  # program order: a group sees the writes of the groups before it
                merged = _merge(written_so_far)
                a, b = g[0].start, g[0].stop
                fresh.append(_unwritten(a, b, merged) if g[0].kind == OpKind.RECV_REDUCE else [])
                written_so_far += [(o.start, o.stop) for o in g]
            merged = _merge(written_so_far)
            pre_parts = []
            for lo, hi in pre:
                unwritten = _unwritten(lo, hi, merged)
                pre_parts += [(c, d, True) for c, d in unwritten]
                cut = [lo] + [e for c, d in unwritten for e in (c, d)] + [hi]  # written parts between them
                pre_parts += [(c, d, False) for c, d in zip(cut[::2], cut[1::2], strict=True) if d > c]
            rounds.append(_Round(k, groups, sorted(data.items()), mirror, sorted(waits.items()), nxt, pre,
                                 fresh, sorted(pre_parts)))
        start = 1 + active[0][0] if active else 1 + R
        never = _unwritten(0, schedule.work_size, _merge(written_so_far))
        return cls(node, 1 + R, rounds, copy_in[0] if active else [], start, schedule.work_size, never,
                   schedule.world_size, direct, tuple(sorted(readers)), tuple(direct_ranges))


__all__ = ["ShmPlan", "direct_messages"]
