"""Point-to-point messages of unknown size over gloo, matched as MPI matches them.

gloo receives only into a buffer of at least the message's size (a smaller one aborts the process), does not say
how much arrived, and keeps receives from any source apart from receives naming the sender. Framed messages fix
all three: every message is a header (length, sequence number per destination and tag) on tag 2t and its payload
on tag 2t+1. The receiving side takes every header with a receive from any source and matches it, in each
sender's order, to the earliest posted receive that accepts it (its source or any), or keeps it as unexpected
until one is posted; only then is the payload received, into the receive's buffer or, when it does not fit,
into scratch (the receive fails with TruncatedMessage and the sender's next message still arrives intact).

Invariant: at least as many header receives are outstanding per tag as receives are waiting for a header, so
every header a waiting receive needs is pulled in.
"""

from __future__ import annotations

import threading

import numpy as np
import torch


class _TagState:
    __slots__ = ("headers", "next_seq", "reorder", "unexpected", "waiting")

    def __init__(self) -> None:
        self.waiting: list = []  # [peer or None, buffer, request] in posting order
        self.unexpected: list = []  # [(source, nbytes)] headers no receive took yet, in arrival order
        self.headers = 0  # header receives outstanding
        self.next_seq: dict[int, int] = {}  # per source: the next header to match
        self.reorder: dict[int, dict[int, int]] = {}  # per source: headers that came early, seq -> nbytes


class FramedMessages:
    """The framed sends and receives of one gloo process group (`waiters` run the blocking waits;
    `request_type()` makes a request; `truncated` is the exception a too-small receive fails with)."""

    def __init__(self, pg, waiters, request_type, truncated: type[BaseException]) -> None:
        self.pg, self.waiters, self.request_type, self.truncated = pg, waiters, request_type, truncated
        self._sent: dict[tuple[int, int], int] = {}  # sequence numbers sent, per (destination, tag)
        self._tags: dict[int, _TagState] = {}
        self._lock = threading.Lock()

    def send(self, payload: torch.Tensor, nbytes: int, peer: int, tag: int):
        key = (peer, tag)
        seq = self._sent[key] = self._sent.get(key, -1) + 1
        header = self.pg.send([torch.tensor([nbytes, seq], dtype=torch.int64)], peer, 2 * tag)
        body = self.pg.send([payload], peer, 2 * tag + 1) if nbytes else None  # after the header, in order

        def wait(_):
            header.wait()
            if body is not None:
                body.wait()
        return self.waiters.run(wait, self.request_type(tag))

    def receive(self, buf: np.ndarray, peer: int | None, tag: int):
        request = self.request_type(tag)
        with self._lock:
            state = self._tags.setdefault(tag, _TagState())
            for i, (source, nbytes) in enumerate(state.unexpected):
                if peer is None or peer == source:
                    del state.unexpected[i]
                    self._take(source, nbytes, buf, request, tag)
                    return request
            state.waiting.append([peer, buf, request])
            self._keep_listening(state, tag)
        return request

    # -- under the lock ---------------------------------------------------------------------------------
    def _keep_listening(self, state: _TagState, tag: int) -> None:
        while state.headers < len(state.waiting):
            state.headers += 1
            header = torch.zeros(2, dtype=torch.int64)
            work = self.pg.recv_anysource([header], 2 * tag)
            self.waiters.run(lambda _, w=work, h=header: self._arrived(w, h, tag), self.request_type(tag))

    def _take(self, source: int, nbytes: int, buf: np.ndarray, request, tag: int) -> None:
        """Receive the payload of `source`'s matched message (posted in the sender's order: the caller holds the
        lock and matches each sender's headers in sequence)."""
        request.origin = source
        if nbytes == 0:
            request.finished = True
            return
        into = buf.reshape(-1).view(np.uint8)
        fits = nbytes <= into.nbytes
        target = torch.from_numpy(into[:nbytes]) if fits else torch.empty(nbytes, dtype=torch.uint8)
        work = self.pg.recv([target], source, 2 * tag + 1)

        def wait(_):
            work.wait()
            if not fits:
                raise self.truncated(f"message of {nbytes} bytes from rank {source}, buffer of {into.nbytes} bytes")
        # the payload's waiter completes the caller's request
        self.waiters.run(wait, request)

    # -- on a waiter thread -------------------------------------------------------------------------------
    def _arrived(self, work, header: torch.Tensor, tag: int) -> None:
        try:
            work.wait()
        except BaseException as exc:  # the group failed: so does every receive waiting on this tag
            with self._lock:
                state = self._tags[tag]
                for _, _, request in state.waiting:
                    request.error, request.finished = exc, True
                state.waiting.clear()
            return
        source, nbytes, seq = work._source_rank(), int(header[0]), int(header[1])
        with self._lock:
            state = self._tags[tag]
            state.headers -= 1
            early = state.reorder.setdefault(source, {})
            early[seq] = nbytes
            nxt = state.next_seq.get(source, 0)
            while nxt in early:  # match this sender's headers in the order it sent them
                self._match(state, source, early.pop(nxt), tag)
                nxt += 1
            state.next_seq[source] = nxt
            self._keep_listening(state, tag)

    def _match(self, state: _TagState, source: int, nbytes: int, tag: int) -> None:
        for i, (peer, buf, request) in enumerate(state.waiting):
            if peer is None or peer == source:
                del state.waiting[i]
                self._take(source, nbytes, buf, request, tag)
                return
        state.unexpected.append((source, nbytes))


__all__ = ["FramedMessages"]
