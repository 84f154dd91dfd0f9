"""alltoallv's count exchange: every rank's send and receive counts, gathered and checked against each other
before any data moves, so inconsistent counts raise on every rank instead of corrupting a buffer."""

from __future__ import annotations

import time

import numpy as np

from ..errors import CallMismatchError
from ..kernels._dtypes import dtype_name
from .agreement import _code
from .errors import CollectiveTimeoutError
from .progress import poll_until


def exchange_counts(ctx, sends: tuple[int, ...], recvs: tuple[int, ...], dtype: np.dtype, algorithm: str,
                    params: dict, timeout: float | None) -> np.ndarray:
    """The p x p counts matrix of an alltoallv call, from every rank's (send, receive) counts (a bounded
    Iallgather); raises CallMismatchError on every rank if the ranks' calls differ (dtype, algorithm, call
    number) and ValueError if rank s's send count to d is not rank d's receive count from s."""
    p = ctx.size
    seq = ctx.seq + 1  # the exchange belongs to the call issued next
    what = f"{dtype_name(dtype)} {algorithm} {sorted(params.items())!r}"
    mine = np.array([seq, _code(what), *sends, *recvs], np.int64)
    allv = np.empty((p, mine.size), np.int64)
    req = ctx.runtime.iallgather(mine, allv)
    limit = ctx.timeout if timeout is None else timeout
    if not poll_until(req, None if limit is None else time.monotonic() + limit):
        err = CollectiveTimeoutError(
            f"rank {ctx.rank}: alltoallv #{seq}: not every rank exchanged its counts within {limit} s (a peer may be "
            "dead, stuck, or have called a different collective)", collective="alltoallv", seq=seq, timeout=limit)
        ctx.fail(err)
        raise err
    if len(set(allv[:, 0].tolist())) > 1 or len(set(allv[:, 1].tolist())) > 1:
        ctx.seq = seq
        raise CallMismatchError(
            f"rank {ctx.rank}: mismatched alltoallv calls at call #{seq}: the ranks differ in their call number, dtype "
            "or algorithm (every rank must issue the same collectives in the same order); no data was exchanged",
            seq=seq, fields={"call": allv[:, 0].tolist()} if len(set(allv[:, 0].tolist())) > 1 else {})
    counts = allv[:, 2:2 + p]
    received = allv[:, 2 + p:].T  # received[s, d]: what rank d expects from rank s
    bad = np.argwhere(counts != received)
    if bad.size:
        ctx.seq = seq
        s, d = (int(v) for v in bad[0])
        raise ValueError(f"alltoallv counts disagree: rank {s} sends {int(counts[s, d])} elements to rank {d}, which "
                         f"expects {int(received[s, d])} from it (send_counts[d] on rank s must equal recv_counts[s] "
                         "on rank d); no data was exchanged")
    return counts.copy()


__all__ = ["exchange_counts"]
