"""Metadata agreement: every rank checks that all ranks issued the same call before any data moves.

Each call (every collective, barrier included) first runs ONE nonblocking `MPI_Iallreduce` with `MPI_MIN` over a
fixed-size int64 vector ``[v, -v]``, where v encodes the call: (sequence number, collective, count, dtype, op,
root, requested algorithm, chosen algorithm and parameters, accumulate, deterministic). The result gives
min(v) and max(v) on every rank at once; min != max for a field means the ranks disagree on it. Because every
call starts with this same Iallreduce, the agreement messages always match, whatever collectives the ranks
called: a mismatch is reported, never a hang or wrong data. Only when a mismatch is detected (all ranks learn
it from the same result) a second `MPI_Iallgather` of fixed-size records names every rank's values.

Modes (`COLLECTIVES_CHECK`, `collectives.init(check=...)`, `Communicator.check`): "metadata" (default),
"full" (metadata, plus an agreement on a hash of the result for collectives whose result is identical on every
rank: allreduce, allgather, broadcast) and "off".
"""

from __future__ import annotations

import json
import zlib
from dataclasses import asdict, dataclass, replace

import numpy as np
from mpi4py import MPI

from .. import environment
from ..errors import CallMismatchError, CollectivesError

MODES = ("metadata", "full", "off")
FIELDS = ("call", "collective", "count", "dtype", "op", "root", "algorithm", "chosen", "accumulate", "deterministic")
_RECORD = 384  # bytes per rank in the mismatch allgather
_COLLECTIVE_IDS = {"allreduce": 1, "reduce_scatter": 2, "allgather": 3, "broadcast": 4, "reduce": 5, "barrier": 6}


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
    """What every rank must agree on for one call."""

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
    """The agreement of one call, driven without blocking: `start()` posts, `test()` returns True once all
    ranks agree and raises CallMismatchError (on every rank) when they do not."""

    def __init__(self, comm: MPI.Comm, meta: CallMeta, rank: int, vector: np.ndarray | None = None) -> None:
        self.comm = comm
        self.meta = meta
        # meta.vector() precomputed (the communicator caches it per call signature, with call = vector[0]: meta's
        # own call number is then a placeholder, set from the vector if a mismatch is reported)
        self._vector = vector
        self.rank = rank
        self.started = False
        self.stage = "agreement"
        self._req: MPI.Request | None = None
        self._buf: np.ndarray | None = None
        self._records: np.ndarray | None = None
        self._differ: list[str] = []

    def start(self) -> None:
        v = self.meta.vector() if self._vector is None else self._vector
        self._buf = np.empty(2 * v.size, dtype=np.int64)
        self._req = self.comm.Iallreduce(np.concatenate([v, -v]), self._buf, MPI.MIN)
        self.started = True

    def test(self) -> bool:
        if not self.started:
            self.start()
        if not self._req.Test():
            return False
        if self._records is None:
            k = len(FIELDS)
            lo, hi = self._buf[:k], -self._buf[k:]
            if np.array_equal(lo, hi):
                return True
            self._differ = [f for f, a, b in zip(FIELDS, lo, hi, strict=True) if a != b]
            if self._vector is not None and self.meta.call != int(self._vector[0]):
                self.meta = replace(self.meta, call=int(self._vector[0]))
            self.stage = "mismatch report (allgather of the call records)"
            send = np.frombuffer(self.meta.record(), dtype=np.uint8)
            self._records = np.empty(_RECORD * self.comm.Get_size(), dtype=np.uint8)
            self._req = self.comm.Iallgather(send, self._records)
            if not self._req.Test():
                return False
        raise self._mismatch()

    def _mismatch(self) -> CallMismatchError:
        p = self.comm.Get_size()
        metas = []
        for r in range(p):
            raw = self._records[r * _RECORD:(r + 1) * _RECORD].tobytes().rstrip(b" ")
            try:
                metas.append(json.loads(raw))
            except ValueError:
                metas.append({})
        fields = {f: [m.get(f) for m in metas] for f in self._differ}
        parts = []
        for f, values in fields.items():
            groups: dict[str, list[int]] = {}
            for r, val in enumerate(values):
                groups.setdefault(json.dumps(val), []).append(r)
            shown = "; ".join(f"{_ranks(rs)}: {val}" for val, rs in groups.items())
            parts.append(f"{'call sequence number' if f == 'call' else f} differs ({shown})")
        mine = self.meta
        hint = (" — a rank skipped or added a call" if "call" in fields else "")
        return CallMismatchError(
            f"rank {self.rank}: mismatched collective calls at call #{mine.call} ({mine.collective}, algorithm "
            f"{mine.algorithm}): {', '.join(parts)}{hint}. Every rank must issue the same collectives in the same "
            "order with the same count, dtype, op, root and algorithm; no data was exchanged",
            seq=mine.call, fields=fields)


def _ranks(rs: list[int]) -> str:
    if len(rs) == 1:
        return f"rank {rs[0]}"
    if rs == list(range(rs[0], rs[-1] + 1)) and len(rs) > 2:
        return f"ranks {rs[0]}-{rs[-1]}"
    return "ranks " + ",".join(map(str, rs))


class ResultCheck:
    """Full-check mode: all ranks agree that a result every rank should hold identically has the same bits."""

    def __init__(self, comm: MPI.Comm, result: np.ndarray, seq: int, collective: str, rank: int) -> None:
        data = np.ascontiguousarray(result).reshape(-1).view(np.uint8)
        h = (zlib.crc32(data) << 31) ^ zlib.adler32(data)
        self._buf = np.array([h, -h], dtype=np.int64)
        self._req = comm.Iallreduce(MPI.IN_PLACE, self._buf, MPI.MIN)
        self.seq, self.collective, self.rank = seq, collective, rank
        self.stage = "result check"

    def test(self) -> bool:
        if not self._req.Test():
            return False
        if self._buf[0] != -self._buf[1]:
            raise CollectivesError(f"rank {self.rank}: {self.collective} #{self.seq}: the ranks' results differ "
                                   "(COLLECTIVES_CHECK=full compares a hash of the result on every rank)")
        return True


__all__ = ["MODES", "Agreement", "CallMeta", "CallMismatchError", "ResultCheck", "check_mode"]
