"""The process group's point-to-point calls (send, recv, recv_anysource) and gloo's monitored_barrier, which is
built on them: a mixin of CollectivesProcessGroup (process_group.py), which provides `_comm()`, `_rank`, `_size`,
`timeout` and the coalescing list."""

from __future__ import annotations

import numpy as np

from . import tensors as T
from .work import LOCK, CollectivesWork, seconds

MONITORED_BARRIER_TAG = 32767  # the library's largest tag: monitored_barrier's messages, apart from users' tags


class PointToPoint:
    def send(self, tensors, dst_rank: int, tag: int = 0):
        staged = [T.Staged(t, "send tensor") for t in tensors]
        return self._p2p("send", [(self._comm().isend, (s.array,), {"dest": dst_rank, "tag": tag}) for s in staged],
                         None, list(tensors))

    def recv(self, tensors, src_rank: int, tag: int = 0):
        return self._recv(tensors, src_rank, tag)

    def recv_anysource(self, tensors, tag: int = 0):
        return self._recv(tensors, None, tag)

    def _recv(self, tensors, source, tag):
        if len(tensors) != 1:
            raise ValueError(f"recv takes one tensor, got {len(tensors)}")
        dst = T.Staged(tensors[0], "recv tensor", copy_in=False)
        return self._p2p("recv", [(self._comm().irecv, (dst.array,), {"source": source, "tag": tag})], dst.done,
                         list(tensors), receive=True)

    def _p2p(self, what, calls, finish, result, receive: bool = False) -> CollectivesWork:
        self._comm()
        with LOCK:
            handles = [fn(*args, **kwargs) for fn, args, kwargs in calls]
            work = CollectivesWork(self, what, handles, finish, result, handles[0] if receive else None)
        if self._coalesced is not None:
            self._coalesced.append(work)
        return work


    def monitored_barrier(self, timeout=None, wait_all_ranks: bool = False) -> None:
        """gloo's monitored_barrier: every rank reports to rank 0 and waits for its answer; rank 0 raises naming the
        ranks that did not arrive within `timeout` (the first one, or all with wait_all_ranks=True). Point-to-point
        messages (tag MONITORED_BARRIER_TAG), so a missing rank is named instead of hanging a collective.
        (torch.distributed.monitored_barrier refuses every backend but gloo by name; call this on the group.)"""
        from ..errors import CollectiveTimeoutError

        limit = seconds(timeout, self.timeout)
        ms = int(limit * 1000) if limit is not None else None
        comm = self._comm()
        token = np.zeros(1, np.uint8)
        if self._rank != 0:
            with LOCK:
                sent = comm.isend(token, 0, MONITORED_BARRIER_TAG)
                ack = comm.irecv(np.zeros(1, np.uint8), 0, MONITORED_BARRIER_TAG)
            for h in (sent, ack):
                try:
                    with LOCK:
                        h.wait(limit)
                except CollectiveTimeoutError:
                    raise RuntimeError(f"[Rank {self._rank}]: rank 0 did not answer monitoredBarrier within {ms} ms "
                                       "(it may have failed, or timed out on another rank)") from None
            return
        with LOCK:
            arrivals = {r: comm.irecv(np.zeros(1, np.uint8), r, MONITORED_BARRIER_TAG) for r in range(1, self._size)}
        missing = []
        for r, h in arrivals.items():
            try:
                with LOCK:
                    h.wait(limit if not missing else 1e-3)
            except CollectiveTimeoutError:
                missing.append(r)
                if not wait_all_ranks:
                    raise RuntimeError(f"[Rank 0]: Rank {r} failed to pass monitoredBarrier in {ms} ms") from None
        if missing:
            raise RuntimeError(f"[Rank 0]: Ranks {', '.join(map(str, missing))} failed to pass monitoredBarrier in "
                               f"{ms} ms")
        with LOCK:
            acks = [comm.isend(token, r, MONITORED_BARRIER_TAG) for r in range(1, self._size)]
        for h in acks:
            with LOCK:
                h.wait(limit)


__all__ = ["MONITORED_BARRIER_TAG", "PointToPoint"]
