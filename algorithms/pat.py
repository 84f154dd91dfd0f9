"""PAT (NCCL's "parallel aggregated trees"): allgather and reduce_scatter in log2(p) steps, for one GPU per node.

Vocabulary. The buffer holds p *blocks*, block r being rank r's (the contract's). A rank's *holdings* are a run
of consecutive blocks (mod p) starting at its own. *Step* k pairs every rank r with the rank at distance
2^k: r receives from r + 2^k and sends to r - 2^k, so every step is a shift of the whole ring of ranks and every
link carries one message.

* allgather, steps k = 0, 1, ..., K-1 (K = ceil(log2 p)): rank r holds blocks [r, r + 2^k); it sends the first
  n_k = min(2^k, p - 2^k) of them to r - 2^k and stores blocks [r + 2^k, r + 2^k + n_k) from r + 2^k, so after
  step k it holds [r, r + 2^(k+1)) (all p blocks after the last step). A run that wraps past block p - 1 is two
  messages (one contiguous range each).
* reduce_scatter, the same steps reversed (k = K-1, ..., 0) with the data flowing the other way: rank r sends
  its partial sums of blocks [r + 2^k, r + 2^k + n_k) to r + 2^k, which reduce-receives them; each block's
  contributions come together along the reversed allgather tree, so rank r ends with block r reduced over
  every rank.

Each rank sends (p-1)/p of the buffer in K steps, against p - 1 for a ring: NCCL runs PAT for allgather and
reduce_scatter when each node has one GPU (src/graph/tuning.cc, ncclPatEnable; the aggregation of steps that
gives PAT its name, src/include/collectives.h PatRSAlgorithm / PatAGAlgorithm, keeps its buffers bounded and is
not modelled: every step here is one round).
"""

from __future__ import annotations

import numpy as np

from collectives.registry import register
from collectives.schedule import ChunkTable, Phase, Round, Schedule, recv, recv_reduce, send


def num_steps(p: int) -> int:
    return max(p - 1, 0).bit_length()


def wrapped(first, n, p: int):
    """The run of n blocks from `first` (mod p) as two contiguous ranges: (first, n1) and (0, n - n1)."""
    first = np.asarray(first) % p
    n1 = np.minimum(n, p - first)
    return (first, n1), (np.zeros_like(first), n - n1)


def pat_round(p: int, reduce: bool) -> Round:
    """Step `it` (allgather: k = it; reduce_scatter: k = K - 1 - it) as one round pattern."""
    K = num_steps(p)

    def slots(m, it):
        m, it = np.asarray(m), np.asarray(it)
        k = (K - 1 - it) if reduce else it
        d = np.left_shift(1, k)
        n = np.minimum(d, p - d)
        if reduce:  # m sends blocks [m + d, + n) to m + d; reduce-receives [m, + n) from m - d
            out_peer, out_first, in_peer, in_first, kind = (m + d) % p, m + d, (m - d) % p, m, recv_reduce
        else:  # m sends blocks [m, + n) to m - d; stores [m + d, + n) from m + d
            out_peer, out_first, in_peer, in_first, kind = (m - d) % p, m, (m + d) % p, m + d, recv
        out = []
        for first, count in wrapped(out_first, n, p):
            out.append(send(np.where(count > 0, out_peer, -1), first, count))
        for first, count in wrapped(in_first, n, p):
            out.append(kind(np.where(count > 0, in_peer, -1), first, count))
        return out

    return Round(slots, repeats=K, name="PAT step")


@register("pat", ("allgather", "reduce_scatter"),
          summary="NCCL's PAT: allgather / reduce_scatter in ceil(log2 p) steps at distances 1, 2, 4, ... "
                  "(reduce_scatter: reversed), (p-1)/p of the buffer per rank; for one GPU per node")
def build_pat(collective: str, world_size: int, count: int, *, root=None, topology=None) -> Schedule:
    if collective not in ("allgather", "reduce_scatter"):
        raise ValueError(f"pat implements allgather and reduce_scatter, not {collective}")
    p = world_size
    work = count * p if collective == "allgather" else count
    phase = Phase(f"PAT {collective.replace('_', '-')}", np.arange(p, dtype=np.int64)[None, :],
                  ChunkTable.whole(work, p), [pat_round(p, collective == "reduce_scatter")])
    return Schedule("pat", collective, p, count, [phase], params={"latency_class": "pat"}, topology=topology)
