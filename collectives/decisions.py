"""Measured decisions: which algorithm (or MPI's own collective, "native") ran fastest on a host, by size.

The chooser (`collectives.choice`) reads these as data for the MPI transport's `auto`: a modelled cluster is
priced by the simulator, a real host by what was measured on it. A table comes from
`collectives calibrate --decisions FILE` (`collectives/benchmark/decide.py` times every candidate against MPI's
own collective, interleaved, as `bench/bench_mpi.py` does, and keeps the fastest per size); the package ships
`data/decisions.json`, measured that way on the machine CI runs on, as the default for hosts without their own.

A table covers one (collective, transport, ranks, oversubscribed) case: transport "shm" when every rank shares
one host (the shared-memory executor), "net" otherwise (point-to-point messages); rows
``[below_bytes, algorithm, params]`` sorted by `below_bytes` (each rank's input bytes; null = no upper bound):
the first row whose bound exceeds the call's size applies.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

FORMAT = "collectives.decisions/1"


@dataclass(frozen=True)
class Decision:
    algorithm: str
    params: dict
    span: str  # the size range the row covers, for the reason
    source: str  # where the table came from


@dataclass(frozen=True)
class Table:
    collective: str
    transport: str
    ranks: int
    oversubscribed: bool
    rows: tuple[tuple[float, str, tuple], ...]
    source: str

    def pick(self, nbytes: int) -> Decision:
        lower = 0.0
        for below, algorithm, params in self.rows:
            if nbytes < below:
                return Decision(algorithm, dict(params), _span(lower, below), self.source)
            lower = below
        _, algorithm, params = self.rows[-1]
        return Decision(algorithm, dict(params), _span(lower, float("inf")), self.source)


def _span(lo: float, hi: float) -> str:
    from .units import format_size

    if hi == float("inf"):
        return f">= {format_size(int(lo))}"
    return f"{format_size(int(lo))}-{format_size(int(hi))}"


def parse(data: dict[str, Any], source: str) -> list[Table]:
    """Tables from a decisions document (raises ValueError naming what is wrong)."""
    if data.get("format") != FORMAT:
        raise ValueError(f"{source}: not a decisions file (format {data.get('format')!r}, expected {FORMAT!r})")
    out = []
    for t in data.get("tables", []):
        try:
            rows = tuple((float("inf") if b is None else float(b), str(a), tuple(sorted(dict(p).items())))
                         for b, a, p in t["rows"])
            table = Table(str(t["collective"]), str(t["transport"]), int(t["ranks"]), bool(t["oversubscribed"]),
                          rows, source)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{source}: malformed decision table {t!r}: {exc}") from None
        if not rows or any(a[0] >= b[0] for a, b in zip(rows, rows[1:], strict=False)):
            raise ValueError(f"{source}: rows of {table.collective} must be sorted by a strictly increasing bound")
        out.append(table)
    return out


@lru_cache(maxsize=8)
def _load(path: str | None) -> tuple[Table, ...]:
    if path is None:
        text = resources.files("collectives").joinpath("data/decisions.json").read_text()
        return tuple(parse(json.loads(text), "the default decisions (collectives/data/decisions.json)"))
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"decisions file {p} does not exist; run `collectives calibrate --decisions {p}` "
                                "under mpiexec to measure this host") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{p}: not valid JSON ({exc})") from None
    return tuple(parse(data, str(p)))


def tables(path: str | None = None) -> tuple[Table, ...]:
    """The tables of `path` (None: the package's defaults)."""
    return _load(None if path is None else str(Path(path).expanduser()))


def lookup(collective: str, nbytes: int, *, transport: str, ranks: int, oversubscribed: bool,
           path: str | None = None) -> Decision | None:
    """The measured decision for this case: the table of the same collective, transport and oversubscription
    whose rank count is nearest (ties: the larger), or None when no table covers the collective."""
    found = [t for t in tables(path) if t.collective == collective and t.transport == transport
             and t.oversubscribed == oversubscribed]
    if not found:
        found = [t for t in tables(path) if t.collective == collective and t.transport == transport]
    if not found:
        return None
    best = min(found, key=lambda t: (abs(t.ranks - ranks), -t.ranks))
    return best.pick(nbytes)


def document(tables_: list[dict], source: str) -> dict:
    """A decisions document for `tables_` (dicts with collective, transport, ranks, oversubscribed, rows)."""
    return {"format": FORMAT, "source": source, "tables": tables_}


__all__ = ["Decision", "FORMAT", "Table", "document", "lookup", "parse", "tables"]
