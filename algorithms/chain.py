"""Chain: the ranks in a line root, root+1, ..., root+p-1 (mod p), data pipelined along it in segments.

Vocabulary. A rank's *position* d is its distance from the root along the chain, d = (rank - root) mod p; the
phase's group lists the ranks in chain order, so member index = position. The buffer is cut into `chunks`
*segments*; a chain is only fast when pipelined, since every segment crosses all p-1 links.

* broadcast: in round t the member at position d sends segment t - d downstream to d+1 (which received it from
  d-1 in round t - 1). p - 2 + chunks rounds; each link carries the buffer once.
* reduce: the mirror image: the member at distance e = p-1-d from the tail sends segment t - e upstream to d-1,
  which reduces it into its own and forwards it one round later; the root ends with the full reduction.
* allreduce: the reduce followed, segment by segment, by the broadcast: the root holds segment s reduced after
  round s + p - 2, and the member at position d sends it downstream in round s + p - 1 + d. 2p - 3 + chunks
  rounds; this is the intra-node chain of NCCL's tree algorithm.

`pipeline_rounds` below cuts any such pipeline (stage i works on segment t - i in round t) into fill, steady
state and drain round patterns; the binomial and double binary tree pipelines use it too.

Invariant the timing keeps: a member receives a segment in a strictly earlier round than it sends that segment
on (reduce: one round earlier; broadcast: one round earlier), and in the allreduce it receives the broadcast
copy of a segment no earlier than it sends its partial sum of that segment upstream.
"""

from __future__ import annotations

import numpy as np

from collectives.registry import register
from collectives.schedule import ChunkTable, Phase, Round, Schedule, check_chunks, recv, recv_reduce, send


def pipeline_rounds(slots, stages: int, chunks: int, name: str, window=None) -> list[Round]:
    """A pipeline's chunks + stages - 1 rounds as fill, steady state and drain; slots(m, t) takes the global t.

    Stage i works on segment t - i in round t. In the steady state (stages - 1 <= t < chunks, when chunks is
    large enough) every stage is busy with an equally sized segment, so those rounds are marked uniform and a
    simulator may cost one of them and multiply; fill and drain are not. `window(m) -> (t_first, t_stop)`, if
    given, bounds the global rounds in which member m can be active (see Round.window).
    """
    if stages == 0:
        return [Round(slots, repeats=0, name=name)]
    cuts = (0, stages - 1, max(stages - 1, chunks), chunks + stages - 1)
    rounds = []
    for lo, hi, part in zip(cuts[:-1], cuts[1:], ("fill", "steady state", "drain"), strict=True):
        if hi > lo:
            local = None if window is None else (lambda m, lo=lo: tuple(t - lo for t in window(m)))
            rounds.append(Round(lambda m, it, lo=lo: slots(m, np.asarray(it) + lo), repeats=hi - lo,
                                uniform=part == "steady state", name=f"{name}, {part}", window=local))
    return rounds


def chain_rounds(p: int, chunks: int, upward: bool, downward: bool) -> list[Round]:
    """Round t: upstream sends at lag (p-1-d), downstream sends at lag `down0` + d, for member at position d."""
    down0 = p - 1 if upward else 0  # the broadcast of a segment starts once the root holds it

    def segment(t, lag, peer, exists):
        seg = t - lag
        on = exists & (seg >= 0) & (seg < chunks)
        return np.where(on, peer, -1), np.minimum(np.maximum(seg, 0), chunks - 1)

    def slots(d, t):
        d = np.asarray(d)
        out = []
        if upward:
            out += [send(*segment(t, p - 1 - d, d - 1, d >= 1)),
                    recv_reduce(*segment(t, p - 2 - d, d + 1, d + 1 < p))]
        if downward:
            out += [send(*segment(t, down0 + d, d + 1, d + 1 < p)),
                    recv(*segment(t, down0 + d - 1, d - 1, d >= 1))]
        return out

    def window(d: int) -> tuple[int, int]:
        # member d works only at the lags of its slots: rounds [min lag, max lag + chunks)
        lags = ([p - 2 - d, p - 1 - d] if upward else []) + ([down0 + d - 1, down0 + d] if downward else [])
        return max(min(lags), 0), max(lags) + chunks

    # lags run from 0 to p-2 in each direction
    stages = (p - 1) * (int(upward) + int(downward)) if p > 1 else 0
    return pipeline_rounds(slots, stages, chunks, "chain step", window)


@register("chain", ("broadcast", "reduce", "allreduce"),
          summary="pipelined chain from the root (root, root+1, ...); allreduce = chain reduce to rank 0 then "
                  "chain broadcast, overlapped; `chunks` segments")
def build_chain(collective: str, world_size: int, count: int, *, root=None, topology=None,
                chunks: int = 1) -> Schedule:
    p, c = world_size, check_chunks("chain", chunks)
    if collective not in ("broadcast", "reduce", "allreduce"):
        raise ValueError(f"chain implements broadcast, reduce and allreduce, not {collective}")
    origin = 0 if root is None else int(root)
    members = ((np.arange(p, dtype=np.int64) + origin) % p)[None, :]  # member d = rank at position d
    upward, downward = collective in ("reduce", "allreduce"), collective in ("broadcast", "allreduce")
    phase = Phase(f"chain {collective}", members, ChunkTable.whole(count, c), chain_rounds(p, c, upward, downward))
    return Schedule("chain", collective, p, count, [phase], root=root, params={"chunks": c}, topology=topology)
