"""One-shot: every rank reads what it needs straight from its peers in ONE round (per segment).

Vocabulary. `chunks` cuts the buffer into *segments*; segment s moves in round s (chunks = 1: one round). Each
collective's data moves directly from the rank that holds it to every rank that needs it:

* allreduce: in round s every rank m sends segment s to every other rank and reduce-receives segment s from
  every other rank. All p-1 receives of a round land in the same range, so `collectives.execution.land_receives`
  fuses them with the local value into ONE kernel call whose operands are sorted by source node: every rank
  computes ``x_0[i] op x_1[i] op ... op x_{p-1}[i]`` folded left to right in rank order (float16/bfloat16
  widened to float32 and rounded once), so the result is bitwise identical on all ranks, and bitwise equal to
  `direct`'s (the same fold, element by element).
* allgather: rank m sends segment s of its own block m to every other rank, which stores it.
* broadcast: the root sends segment s to every other rank.
* reduce: every rank but the root sends segment s to the root, which reduce-receives all of them in one fused
  call (rank order, as allreduce).

Cost: one synchronisation per segment (the fewest any of these collectives can have) against a ring's p-1 or
2(p-1) and a tree's lg p; the price is incast (a rank receives p-1 messages at once: allreduce (p-1)·n·b bytes in,
against a ring's 2(p-1)/p·n·b). The latency-bound end of the size range is where it wins: over shared memory
(the transport's executor reads peers' windows in place) a small call is one wait for the peers' counters and
one copy or fused kernel call. NCCL's NVLS one-shot and TensorRT-LLM's "oneshot" custom allreduce are the
allreduce schedule; MPICH's shared-memory "direct" algorithms the others.
"""

from __future__ import annotations

import numpy as np

from collectives.registry import register
from collectives.schedule import ChunkTable, Phase, Round, Schedule, check_chunks, recv, recv_reduce, send


def _phase(name: str, p: int, table: ChunkTable, chunks: int, slots) -> Phase:
    ranks = np.arange(p, dtype=np.int64)[None, :]
    return Phase(name, ranks, table, [Round(slots, repeats=int(chunks) if p > 1 else 0, uniform=True, name=name)])


def one_shot_phase(p: int, table: ChunkTable, chunks: int) -> Phase:
    """allreduce, round s: member m sends segment s to every other member and reduce-receives segment s from
    every other member. Sends first, then the receives in source order d = 1..p-1 (land_receives sorts them by
    node)."""
    def slots(m, it):
        out = [send((m + d) % p, it) for d in range(1, p)]
        out += [recv_reduce((m - d) % p, it) for d in range(1, p)]
        return out

    return _phase("one-shot exchange", p, table, chunks, slots)


def one_shot_allgather_phase(p: int, table: ChunkTable, chunks: int) -> Phase:
    """Round s: member m sends segment s of block m (chunk m*chunks + s) to every other member and stores
    segment s of every other member's block."""
    c = int(chunks)

    def slots(m, it):
        out = [send((m + d) % p, m * c + it) for d in range(1, p)]
        out += [recv((m - d) % p, ((m - d) % p) * c + it) for d in range(1, p)]
        return out

    return _phase("one-shot allgather", p, table, chunks, slots)


def one_shot_rooted_phase(p: int, root: int, table: ChunkTable, chunks: int, reduce: bool) -> Phase:
    """Round s: broadcast: the root sends segment s to every other member; reduce: every other member sends
    segment s to the root, which reduce-receives all of them (one fused reduction)."""
    def slots(m, it):
        at_root = np.asarray(m) == root
        out = []
        for d in range(1, p):
            q = (root + d) % p
            if reduce:
                out.append(send(np.where(np.asarray(m) == q, root, -1) + 0 * it, it))
            else:
                out.append(send(np.where(at_root, q, -1) + 0 * it, it))
        for d in range(1, p):
            q = (root + d) % p
            if reduce:
                out.append(recv_reduce(np.where(at_root, q, -1) + 0 * it, it))
            else:
                out.append(recv(np.where(np.asarray(m) == q, root, -1) + 0 * it, it))
        return out

    return _phase("one-shot reduce" if reduce else "one-shot broadcast", p, table, chunks, slots)


@register("one_shot", ("allreduce", "allgather", "broadcast", "reduce"),
          summary="one round per segment: every rank reads what it needs straight from its peers (allreduce folds "
                  "all p operands in rank order); fewest synchronisations, incast: for small messages")
def build_one_shot(collective: str, world_size: int, count: int, *, root=None, topology=None,
                   chunks: int = 1) -> Schedule:
    check_chunks("one_shot", chunks, "segments")
    p, c = world_size, int(chunks)
    if collective == "allreduce":
        phase = one_shot_phase(p, ChunkTable.whole(count, 1, c), c)
    elif collective == "allgather":
        phase = one_shot_allgather_phase(p, ChunkTable.whole(count * p, p, c), c)
    elif collective in ("broadcast", "reduce"):
        phase = one_shot_rooted_phase(p, int(root), ChunkTable.whole(count, 1, c), c, collective == "reduce")
    else:
        raise ValueError(f"one_shot implements allreduce, allgather, broadcast and reduce, not {collective}")
    return Schedule("one_shot", collective, p, count, [phase], root=root, params={"chunks": c}, topology=topology)
