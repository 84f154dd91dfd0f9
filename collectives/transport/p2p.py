"""Point-to-point messages between ranks of a communicator: send, recv, and their nonblocking forms.

They travel on a duplicate of the library's communicator of their own, so a user's tags never meet the tags of
the library's schedules, and they are independent of the collectives' order (as MPI's are). Every wait is
bounded by the communicator's timeout; a receive may name any source (`source=None`) and any tag (`tag=None`),
and its handle then tells who sent it (`PointToPoint.source`).
"""

from __future__ import annotations

import time

import numpy as np

from ..errors import CollectiveTimeoutError, PeerFailedError
from .calls import check_timeout


class PointToPoint:
    """Handle of one send or receive (`isend`/`irecv`): `wait(timeout)`, `test()`, and for a receive `source`
    and `tag` once complete."""

    def __init__(self, ctx, req, kind: str, peer, tag, buf: np.ndarray) -> None:
        self._ctx, self._req, self.kind, self._peer, self._tag = ctx, req, kind, peer, tag
        self.buffer = buf
        self.done = False

    def test(self) -> bool:
        if not self.done:
            try:
                self.done = bool(self._req.Test())
            except self._ctx.p2p.failure as exc:
                if self._ctx.p2p.truncated(exc):
                    self.done = True
                    raise ValueError(f"rank {self._ctx.rank}: recv: the message is larger than the buffer of "
                                     f"{self.buffer.nbytes} bytes; pass a buffer as large as what is sent") from None
                raise self._failed(exc) from exc
        return self.done

    is_completed = test

    def wait(self, timeout: float | None = None) -> np.ndarray:
        """Block until complete (at most `timeout` s, default the communicator's) and return the buffer."""
        limit = self._ctx.timeout if timeout is None else check_timeout(timeout, "wait(timeout=)")
        deadline = None if limit is None else time.monotonic() + limit
        nap = 0.0
        while not self.test():
            if deadline is not None and time.monotonic() > deadline:
                who = "any rank" if self._peer is None else f"rank {self._peer}"
                raise CollectiveTimeoutError(
                    f"rank {self._ctx.rank}: {self.kind} {'to' if self.kind == 'send' else 'from'} {who} (tag "
                    f"{'any' if self._tag is None else self._tag}) did not complete within {limit} s; the peer may "
                    "be dead, stuck, or not have posted the matching operation", collective=self.kind,
                    peers=() if self._peer is None else (self._peer,), timeout=limit)
            nap = min(2e-4, nap * 2 or 1e-6)
            time.sleep(nap)
        return self.buffer

    @property
    def source(self) -> int:
        """The rank a completed receive came from."""
        return self._req.source() if self.kind == "recv" else self._ctx.rank

    @property
    def tag(self) -> int:
        """The tag of a completed receive."""
        return self._req.tag() if self.kind == "recv" else int(self._tag)

    def _failed(self, exc: BaseException) -> PeerFailedError:
        err = PeerFailedError(f"rank {self._ctx.rank}: {self.kind} failed: {exc}",
                              collective=self.kind, peers=() if self._peer is None else (self._peer,))
        self._ctx.fail(err)
        return err


def _check(ctx, x, peer, tag, what: str, any_allowed: bool) -> tuple[np.ndarray, int, int]:
    ctx.check_open()
    if not isinstance(x, np.ndarray) or not x.flags.c_contiguous:
        raise TypeError(f"{what} needs a C-contiguous numpy.ndarray, got {type(x).__name__}")
    if peer is None and any_allowed:
        src = None
    elif isinstance(peer, (int, np.integer)) and not isinstance(peer, bool) and 0 <= peer < ctx.size:
        src = int(peer)
    else:
        valid = f"an integer in [0, {ctx.size})" + (" or None (any source)" if any_allowed else "")
        raise ValueError(f"{what}: the peer must be {valid}, got {peer!r}")
    if tag is None and any_allowed:
        t = None
    elif isinstance(tag, (int, np.integer)) and not isinstance(tag, bool) and 0 <= tag <= 32767:
        t = int(tag)
    else:
        raise ValueError(f"{what}: the tag must be an integer in [0, 32767]" + (" or None (any tag)" if any_allowed
                                                                              else "") + f", got {tag!r}")
    return x, src, t


def isend(ctx, x: np.ndarray, dest: int, tag: int = 0) -> PointToPoint:
    x, dest, tag = _check(ctx, x, dest, tag, "send", any_allowed=False)
    req = ctx.p2p.isend(x.reshape(-1).view(np.uint8), dest, tag)
    return PointToPoint(ctx, req, "send", dest, tag, x)


def irecv(ctx, out: np.ndarray, source: int | None = None, tag: int | None = None) -> PointToPoint:
    if isinstance(out, np.ndarray) and not out.flags.writeable:
        raise ValueError("recv: the buffer is read-only; pass a writeable array")
    out, src, t = _check(ctx, out, source, tag, "recv", any_allowed=True)
    req = ctx.p2p.irecv_any(out.reshape(-1).view(np.uint8), src, t)
    return PointToPoint(ctx, req, "recv", source, tag, out)


__all__ = ["PointToPoint", "irecv", "isend"]
