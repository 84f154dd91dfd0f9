"""The call agreement: every rank checks that all ranks issued the same call before any data moves.

Modes (`COLLECTIVES_CHECK`, `collectives.init(check=...)`, `Communicator.check`): "metadata" (default),
"full" (metadata, plus an agreement on a hash of the result for collectives whose result is identical on every
rank: allreduce, allgather, broadcast) and "off".

What is compared is the call's `Signature` (calls.py: collective, count, dtype, op, root, algorithm requested
and chosen, accumulate, deterministic) and its number on the communicator. Two ways, by where the ranks are:

* all ranks on one host (the communicator has an arena): each rank writes (call number, signature hash) into its
  control block. A call run by the shared-memory plan runner compares them inside its own waits (csrc/plan.h):
  no extra synchronisation. A call of another executor (MPI's own collective, point-to-point messages) first
  runs `HostAgreement`: sign, then wait until every peer has signed this call number, and compare.
* otherwise `Agreement`: ONE nonblocking allreduce (min; `MPI_Iallreduce` under MPI) over an int64 vector ``[v, -v]``, v
  encoding the call field by field: min != max for a field means the ranks disagree on it.

Either way a mismatch is found by every rank (every rank compares with every peer before its call returns), and
`MismatchReport` then gathers every rank's record (one allgather) so the error names each rank's values.
"""

from __future__ import annotations

import json
import time
import zlib
from dataclasses import asdict, dataclass

import numpy as np

from .. import environment
from ..errors import CallMismatchError, CollectivesError
from .calls import Signature
from .shm.arena import DONE, NOT_STARTED

MODES = ("metadata", "full", "off")
FIELDS = ("call", "collective", "count", "dtype", "op", "root", "algorithm", "chosen", "accumulate", "deterministic")
_RECORD = 384  # bytes per rank in the mismatch allgather
_COLLECTIVE_IDS = {"allreduce": 1, "reduce_scatter": 2, "allgather": 3, "broadcast": 4, "reduce": 5, "barrier": 6,
                   "alltoall": 7, "alltoallv": 8}


def check_mode(mode: str | None) -> str:
    """Validate a check mode (None: from COLLECTIVES_CHECK, default "metadata")."""
    if mode is None:
        mode = environment.get("COLLECTIVES_CHECK")
    mode = str(mode).lower()
    if mode not in MODES:
        raise ValueError(f"check must be one of {', '.join(MODES)} (COLLECTIVES_CHECK), got {mode!r}")
    return mode


def _code(text: str) -> int:
    """A stable 63-bit code of a string (the same on every host and run)."""
    data = text.encode()
    return (zlib.crc32(data) << 31) ^ zlib.adler32(data)


@dataclass(frozen=True)
class CallMeta:
    """One call as the agreement compares it: its number and signature."""

    call: int
    collective: str
    count: int
    dtype: str
    op: str
    root: int | None
    algorithm: str
    chosen: str
    accumulate: str
    deterministic: bool

    @classmethod
    def of(cls, seq: int, sig: Signature) -> CallMeta:
        return cls(seq, sig.collective, sig.count, sig.dtype, sig.op, sig.root, sig.algorithm, sig.chosen,
                   sig.accumulate, sig.deterministic)

    def vector(self) -> np.ndarray:
        v = [self.call, _COLLECTIVE_IDS.get(self.collective, 0), self.count, _code(self.dtype), _code(self.op),
             -1 if self.root is None else self.root, _code(self.algorithm), _code(self.chosen),
             _code(self.accumulate), int(self.deterministic)]
        return np.array(v, dtype=np.int64)

    def record(self) -> bytes:
        data = json.dumps(asdict(self), separators=(",", ":")).encode()
        if len(data) > _RECORD:  # very long parameter lists: keep the codes, cut the text
            d = asdict(self)
            d["chosen"] = f"{self.chosen[:40]}... (code {_code(self.chosen)})"
            data = json.dumps(d, separators=(",", ":")).encode()[:_RECORD]
        return data.ljust(_RECORD, b" ")


class Agreement:
    """The agreement of one call across hosts, driven without blocking: `test()` returns True once all ranks agree and
    raises CallMismatchError (on every rank) when they do not."""

    stage = "agreement"

    def __init__(self, runtime, meta: CallMeta, rank: int) -> None:
        self.runtime = runtime
        self.meta = meta
        self.rank = rank
        v = meta.vector()
        self._buf = np.empty(2 * v.size, dtype=np.int64)
        self._req = runtime.iallreduce(np.concatenate([v, -v]), self._buf, "min")
        self._report: MismatchReport | None = None

    def test(self) -> bool:
        if self._report is not None:
            return self._report.test()
        if not self._req.Test():
            return False
        k = len(FIELDS)
        lo, hi = self._buf[:k], -self._buf[k:]
        if np.array_equal(lo, hi):
            return True
        self.stage = "mismatch report (allgather of the call records)"
        self._report = MismatchReport(self.runtime, self.meta, self.rank)
        return self._report.test()


class HostAgreement:
    """The agreement of one call on one host, for calls the plan runner does not execute: sign this rank's
    slot, then `test()` until every peer has signed the same call number (True) or shows another signature or
    a poison word (CallMismatchError, after the report)."""

    stage = "agreement"

    def __init__(self, runtime, arena, meta: CallMeta | tuple[int, Signature], signature: int,
                 flag: bool | None = None) -> None:
        """`meta`: the call, or (call number, Signature): the CallMeta is then built only for a mismatch report
        (it costs more than the rest of the agreement of a call of MPI's own collective). `flag`: a bit this rank
        publishes with its signature; once the agreement is complete, `all_flags` is True when every rank's was
        set (the same answer on every rank: executors.NativeExecutor decides with it what every rank does)."""
        self.runtime, self.arena, self._meta, self.signature = runtime, arena, meta, signature
        self.seq = meta.call if isinstance(meta, CallMeta) else meta[0]
        self._report: MismatchReport | None = None
        self._flag = flag
        self.all_flags: bool | None = None  # None: no flag was asked for (or the agreement is not complete)
        arena.sign(self.seq, signature, None if flag is None else int(flag))

    @property
    def meta(self) -> CallMeta:
        if not isinstance(self._meta, CallMeta):
            self._meta = CallMeta.of(*self._meta)
        return self._meta

    @property
    def waiting(self) -> tuple[int, ...]:
        """The peers that have not started this call (for a timeout report)."""
        a = self.arena
        return tuple(q for q in range(a.size) if q != a.rank and a.compare(q, self.seq, self.signature) == NOT_STARTED)

    def test(self) -> bool:
        if self._report is not None:
            return self._report.test()
        state, out = self.arena.agree(self.seq, self.signature)
        if state == 0:
            return False
        if state < 0:
            self.arena.poison(self.seq)
            return self.mismatch()
        if self._flag is not None:
            self.all_flags = bool(self._flag and out)
        return True

    def mismatch(self) -> bool:
        """Start the report (every rank gets here for this call): raises once it is complete."""
        self.stage = "mismatch report (allgather of the call records)"
        self._report = MismatchReport(self.runtime, self.meta, self.runtime.rank, self.arena)
        return self._report.test()


class MismatchReport:
    """The records of every rank for a mismatched call (an Iallgather every rank joins), then the error; on one
    host the arena's counters restart together (the mismatched programs stopped wherever they were)."""

    def __init__(self, runtime, meta: CallMeta, rank: int, arena=None) -> None:
        self.runtime, self.meta, self.rank, self.arena = runtime, meta, rank, arena
        p = runtime.size
        done = 0
        if arena is not None:
            done = arena.counter(arena.rank, DONE)
        send = np.frombuffer(meta.record() + int(done).to_bytes(8, "little", signed=True), dtype=np.uint8)
        self._width = _RECORD + 8
        self._records = np.empty((p, self._width), dtype=np.uint8)
        self._req = runtime.iallgather(send, self._records)

    def test(self) -> bool:
        if not self._req.Test():
            return False
        p = self.runtime.size
        metas, counters = [], []
        for r in range(p):
            raw = self._records[r].tobytes()
            counters.append(int.from_bytes(raw[_RECORD:], "little", signed=True))
            try:
                metas.append(json.loads(raw[:_RECORD].rstrip(b" ")))
            except ValueError:
                metas.append({})
        if self.arena is not None:
            self.arena.resynchronise(max(counters) + 1)
        raise describe_mismatch(self.meta, self.rank, metas)


def describe_mismatch(mine: CallMeta, rank: int, metas: list[dict]) -> CallMismatchError:
    """The error every rank raises: each field that differs, with which ranks had which value."""
    fields = {f: [m.get(f) for m in metas] for f in FIELDS
              if len({json.dumps(m.get(f)) for m in metas}) > 1}
    parts = []
    for f, values in fields.items():
        groups: dict[str, list[int]] = {}
        for r, val in enumerate(values):
            groups.setdefault(json.dumps(val), []).append(r)
        shown = "; ".join(f"{_ranks(rs)}: {val}" for val, rs in groups.items())
        parts.append(f"{'call sequence number' if f == 'call' else f} differs ({shown})")
    hint = " — a rank skipped or added a call" if "call" in fields else ""
    what = ", ".join(parts) or "the ranks' calls differ"
    return CallMismatchError(
        f"rank {rank}: mismatched collective calls at call #{mine.call} ({mine.collective}, algorithm "
        f"{mine.algorithm}): {what}{hint}. Every rank must issue the same collectives in the same order with the "
        "same count, dtype, op, root and algorithm; no data was exchanged", seq=mine.call, fields=fields)


def report_mismatch(runtime, meta: CallMeta, rank: int, arena, deadline: float | None) -> CallMismatchError:
    """After the plan runner found a mismatch: gather every rank's record (bounded by `deadline`) and return the
    error to raise (a timeout error when a peer never joins the report)."""
    report = MismatchReport(runtime, meta, rank, arena)
    nap = 0.0
    while True:
        try:
            if report.test():  # pragma: no cover - a report always ends in an error
                break
        except CallMismatchError as exc:
            return exc
        if deadline is not None and time.monotonic() > deadline:
            from ..errors import CollectiveTimeoutError
            return CollectiveTimeoutError(
                f"rank {rank}: {meta.collective} #{meta.call}: the ranks' calls differ, and not every rank joined "
                "the mismatch report in time", collective=meta.collective, seq=meta.call)
        nap = min(1e-3, nap * 2 or 1e-6)
        time.sleep(nap)
    raise AssertionError("unreachable")


class ResultCheck:
    """Full-check mode: all ranks agree that a result every rank should hold identically has the same bits."""

    stage = "result check"

    def __init__(self, runtime, result: np.ndarray, seq: int, collective: str, rank: int) -> None:
        data = np.ascontiguousarray(result).reshape(-1).view(np.uint8)
        h = (zlib.crc32(data) << 31) ^ zlib.adler32(data)
        self._buf = np.empty(2, dtype=np.int64)
        self._req = runtime.iallreduce(np.array([h, -h], dtype=np.int64), self._buf, "min")
        self.seq, self.collective, self.rank = seq, collective, rank

    def test(self) -> bool:
        if not self._req.Test():
            return False
        if self._buf[0] != -self._buf[1]:
            raise CollectivesError(f"rank {self.rank}: {self.collective} #{self.seq}: the ranks' results differ "
                                   "(COLLECTIVES_CHECK=full compares a hash of the result on every rank)")
        return True


def _ranks(rs: list[int]) -> str:
    if len(rs) == 1:
        return f"rank {rs[0]}"
    if rs == list(range(rs[0], rs[-1] + 1)) and len(rs) > 2:
        return f"ranks {rs[0]}-{rs[-1]}"
    return "ranks " + ",".join(map(str, rs))


__all__ = ["MODES", "Agreement", "CallMeta", "CallMismatchError", "HostAgreement", "ResultCheck", "check_mode",
           "MismatchReport", "describe_mismatch", "report_mismatch"]
