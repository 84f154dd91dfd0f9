"""One-shot allreduce: one round in which every rank reads every other rank's whole buffer and reduces.

Vocabulary. `chunks` cuts the buffer into *segments*; segment s moves in round s (chunks = 1: one round).

* allreduce: in round s every rank m sends segment s to every other rank and reduce-receives segment s from
  every other rank. All p-1 receives of a round land in the same range, so
  `collectives.execution.land_receives` fuses them with the local value into ONE kernel call whose operands are
  sorted by source node: every rank computes ``x_0[i] op x_1[i] op ... op x_{p-1}[i]`` folded left to right in
  rank order (float16/bfloat16 widened to float32 and rounded once), so the result is bitwise identical on all
  ranks, and bitwise equal to `direct`'s (the same fold, element by element).

Cost: one synchronisation (the fewest any allreduce can have) against direct's two and a ring's 2(p-1); each
rank receives (p-1) whole buffers and reduces p operands per element, (p-1)·n·b bytes in against a ring's
2(p-1)/p·n·b. The latency-bound end of the size range is where it wins: over shared memory (the transport's
`shm` executor reads peers' windows in place) a small allreduce is one wait for the peers' counters and one fused
kernel call. NCCL's NVLS one-shot and TensorRT-LLM's "oneshot" custom allreduce are the same schedule.
"""

from __future__ import annotations

import numpy as np

from collectives.registry import register
from collectives.schedule import ChunkTable, Phase, Round, Schedule, check_chunks, recv_reduce, send


def one_shot_phase(p: int, table: ChunkTable, chunks: int) -> Phase:
    """Round s: member m sends segment s to every other member and reduce-receives segment s from every other
    member. Sends first, then the receives in source order d = 1..p-1 (land_receives sorts them by node)."""
    def slots(m, it):
        out = [send((m + d) % p, it) for d in range(1, p)]
        out += [recv_reduce((m - d) % p, it) for d in range(1, p)]
        return out

    ranks = np.arange(p, dtype=np.int64)[None, :]
    return Phase("one-shot exchange", ranks, table,
                 [Round(slots, repeats=int(chunks) if p > 1 else 0, uniform=True, name="one-shot exchange")])


@register("one_shot", ("allreduce",),
          summary="one round: every rank reads every peer's whole buffer and folds all p operands in rank order; "
                  "fewest synchronisations, (p-1) buffers received per rank: for small messages")
def build_one_shot(collective: str, world_size: int, count: int, *, root=None, topology=None,
                   chunks: int = 1) -> Schedule:
    check_chunks("one_shot", chunks, "segments")
    if collective != "allreduce":
        raise ValueError(f"one_shot implements allreduce only, not {collective}")
    p, c = world_size, int(chunks)
    table = ChunkTable.whole(count, 1, c)
    return Schedule("one_shot", collective, p, count, [one_shot_phase(p, table, c)], root=root,
                    params={"chunks": c}, topology=topology)
