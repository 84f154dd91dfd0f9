"""What the shared-memory executor's rounds cost a rank's core: the copies and reductions of its plans.

The simulator prices a message on the links it crosses: on the loopback topology a receive costs one copy
round (the sender's mirror into its window plus the receiver's landing) and a receive-reduce a reduce round.
That is what a ring does, round after round. The shared-memory executor (transport/shm.py) does less where
several messages carry one range in one round:

* a run of receive-reduces of one range from k senders lands as ONE fused reduce over the local value and
  the k windows (k + 1 inputs read, one output written), not k reduce rounds;
* a range several peers read is mirrored into the window once, not once per reader.

A double binary tree at p = 4 has both (its inner nodes reduce from two children and send to two): per call the
ranks make 10 mirror copies, 6 landings and 4 fused reduces of half the buffer, where the simulator charges 12
copy rounds and 6 reduce rounds; measured on 2 cores at 4-16 MiB it runs ~0.8x the ring's time, which the
simulator's links price the same.

This module prices the executor's own plan (`transport.shm_plan.ShmPlan`, the decisions shm.py and the C
runner execute) in the calibration's units: a copy round of m bytes is one mirror plus one landing, each taken
as half of it (both are memcpys of m bytes); a reduce round adds the reduction's extra cost over a landing,
charged per input beyond the local value (each is one more stream of m bytes read). `benchmark/cores.py` uses
the total (processor time) and the longest chain of dependent steps (critical path) when ranks share cores.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..schedule import OpKind


@dataclass
class RankSteps:
    """One rank's plan priced: seconds of each step, in program order, and the counter values it publishes."""

    start_s: float  # input ranges copied into the window before the first round
    start_offset: int  # counters published after that copy
    rounds: list[tuple[float, float]]  # per plan round: (landing seconds, mirror + copy-in seconds)
    end_s: float  # ranges no round writes, copied from the input at the end


def _bytes(ranges, itemsize: int) -> int:
    return sum(hi - lo for lo, hi in ranges) * itemsize


def rank_steps(splan, itemsize: int, copy_s: float, extra_s: float,
               read_s: Callable[[int], float] | None = None) -> RankSteps:
    """Price one rank's ShmPlan: `copy_s` seconds per byte of one copy (half a copy round), `extra_s` seconds per
    byte of each reduced input beyond the local value (reduce round - copy round).

    `read_s(peer)`: seconds per byte of a landing from that peer's window, when it depends on the peer (ranks that
    share a core read each other's windows from their own caches; across cores the lines cross the host's
    fabric). A landing then costs read_s(peer); a fused reduce costs a local copy plus, per input, what reading
    that peer adds to it (read_s(peer) - copy_s). None: every landing is a copy."""
    rounds = []
    for r in splan.rounds:
        land = 0.0
        for group in r.groups:
            nbytes = (group[0].stop - group[0].start) * itemsize
            reducing = sum(1 for o in group if o.kind == OpKind.RECV_REDUCE)
            crossing = 0.0 if read_s is None else sum(read_s(o.peer) - copy_s for o in group)
            land += nbytes * (copy_s + crossing + reducing * extra_s)
        mirror = (_bytes(r.mirror, itemsize) + _bytes(r.copy_next, itemsize)) * copy_s
        rounds.append((land, mirror))
    return RankSteps(_bytes(splan.copy_in, itemsize) * copy_s, splan.start_offset, rounds,
                     _bytes(splan.never_written, itemsize) * copy_s)


def processor_seconds(steps: list[RankSteps]) -> float:
    """Every rank's copies and reductions, summed: the core time the whole call needs."""
    return sum(s.start_s + s.end_s + sum(a + b for a, b in s.rounds) for s in steps)


@dataclass
class PathResult:
    seconds: float  # when the last rank finishes
    blocked_waits: int  # waits a rank reached before its peer had published (it had to be woken)


def critical_path(splans: list, steps: list[RankSteps], latency: float, handoff: float = 0.0) -> PathResult:
    """Play the ranks' priced plans against each other, every rank on its own core: a step starts once the
    rank's previous step is over and the counters it waits for are published, `latency` after the peer
    published them (the per-round synchronisation). A wait the rank reaches before its counter is published
    *blocks*; the rank resumes `handoff` seconds after the counter shows (with ranks sharing cores: the context
    switch back to it). Counters are shm.py's: `done` and `read` take a round's `advance_to` at its
    end, and `read` takes 2 + k early when the round mirrors after landing."""
    done = [[(s.start_offset, s.start_s)] for s in steps]  # per rank: (value, time published), increasing
    read = [[(s.start_offset, s.start_s)] for s in steps]
    clock = [s.start_s for s in steps]
    position = [0] * len(steps)
    landed = [False] * len(steps)  # the current round's landing is done (its mirror may still wait)
    blocked = 0

    def arrival(rank: int, published: float, waits) -> float:
        nonlocal blocked
        if not waits:
            return clock[rank]
        at = published + latency
        if at > clock[rank] + latency + 1e-12 * max(at, 1.0):
            blocked += 1
            at += handoff
        return max(clock[rank], at)

    # ranks advance in turns; one stops at a wait whose counter is not published yet and resumes on a later
    # turn (the plans are deadlock-free, so some rank advances on every turn until all are done)
    while True:
        pending = progressed = False
        for rank, (splan, s) in enumerate(zip(splans, steps, strict=True)):
            while position[rank] < len(s.rounds):
                r = splan.rounds[position[rank]]
                land, mirror = s.rounds[position[rank]]
                if not landed[rank]:
                    ready = _published(done, r.data_waits)
                    if ready is None:
                        pending = True
                        break
                    clock[rank] = arrival(rank, ready, r.data_waits) + land
                    landed[rank] = progressed = True
                    if r.mirror:
                        read[rank].append((2 + r.k, clock[rank]))  # this round's reads are over
                if r.mirror:
                    after = _published(read, r.mirror_waits)
                    if after is None:
                        pending = True
                        break
                    clock[rank] = arrival(rank, after, r.mirror_waits)
                clock[rank] += mirror
                done[rank].append((r.advance_to, clock[rank]))
                read[rank].append((r.advance_to, clock[rank]))
                landed[rank] = False
                position[rank] += 1
                progressed = True
        if not pending:
            break
        if not progressed:
            raise RuntimeError("the shared-memory plans wait on each other in a cycle")
    return PathResult(max(c + s.end_s for c, s in zip(clock, steps, strict=True)), blocked)


def _published(counters: list[list[tuple[int, float]]], waits) -> float | None:
    """When every (peer, offset) wait is satisfied (0.0 for none), or None if some peer has not got there."""
    at = 0.0
    for q, offset in waits:
        t = next((time for value, time in counters[q] if value >= offset), None)
        if t is None:
            return None
        at = max(at, t)
    return at


__all__ = ["PathResult", "RankSteps", "critical_path", "processor_seconds", "rank_steps"]
