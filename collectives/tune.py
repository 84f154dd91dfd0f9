"""Tuning tables: the chooser's verdict per size range, with the runners-up (NCCL's tuning table, readable).

`tune(topology, collective, sizes)` -> TuneTable: the predicted time of every candidate per size (each at the
parameters `collectives.choice` would give it), the winner, and the size ranges each algorithm wins. The
choice itself, COLLECTIVES_ALGO and COLLECTIVES_DEBUG live in `collectives.choice`; this module only tabulates.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field

from .choice import candidates, describe_choice, price


@dataclass
class TuneRow:
    nbytes: int
    times: dict[str, float]  # seconds per algorithm (at the chunk count chosen for it)
    winner: str
    params: dict[str, dict] = field(default_factory=dict)  # per algorithm: the parameters the tuner chose

    def label(self, name: str) -> str:
        return describe_choice(name, self.params.get(name))


@dataclass
class TuneTable:
    topology: str
    world_size: int
    collective: str
    rows: list[TuneRow]
    skipped: dict[str, str] = field(default_factory=dict)
    note: str = ""

    def ranges(self) -> list[tuple[int, int, str]]:
        """(first size, last size, winner) for each run of sizes with the same winner."""
        out: list[tuple[int, int, str]] = []
        for row in self.rows:
            if out and out[-1][2] == row.winner:
                out[-1] = (out[-1][0], row.nbytes, row.winner)
            else:
                out.append((row.nbytes, row.nbytes, row.winner))
        return out

    def format(self) -> str:
        from .units import format_size

        lines = [f"# collectives tuning table: {self.collective} on {self.topology} ({self.world_size:,} ranks), "
                 "analytic model"]
        if self.note:
            lines.append(f"# {self.note}")
        lines.append(f"# {'size range':<23} {'choice (protocol, channels)':<36} {'time(us)':>12}   runners-up: time(us)")
        by_size = {r.nbytes: r for r in self.rows}
        for lo, hi, name in self.ranges():
            rng = format_size(lo) if lo == hi else f"{format_size(lo)} - {format_size(hi)}"
            row = by_size[hi]
            others = sorted((n for n in row.times if n != name), key=row.times.get)
            runners = ", ".join(f"{row.label(n)} {row.times[n] * 1e6:,.2f}" for n in others[:3])
            lines.append(f"  {rng:<23} {row.label(name):<36} {row.times[name] * 1e6:>12,.2f}   {runners} "
                         f"(at {format_size(hi)})")
        for name, why in self.skipped.items():
            lines.append(f"# not a candidate: {name}: {why}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


def tune(topology, collective: str = "allreduce", sizes=None, algorithms: list[str] | None = None,
         dtype: str = "float32", op: str = "sum", progress=None, choose_chunks: bool = True,
         **params) -> TuneTable:
    """Predict every candidate at every size (bytes; default 8 B..8 GiB by powers of 2) and tabulate winners.

    `params` maps an algorithm name to its builder parameters, e.g. hierarchical={"inter": "ring"}. Each
    candidate is priced as `collectives.choice` prices it (protocol and channels on a runtime cluster; with
    `choose_chunks`, the best chunk count elsewhere), and row.params says at what.
    """
    from .simulator.engine import resolve_topology

    topology = resolve_topology(topology)
    sizes = [8 << i for i in range(31)] if sizes is None else [int(s) for s in sizes]
    if algorithms is None:
        names, how = candidates(collective, topology)
    else:
        names, how = list(algorithms), ""
    table: dict[str, list[float]] = {}
    chosen: dict[str, list[dict]] = {}
    skipped: dict[str, str] = {}
    for i, name in enumerate(names):
        try:
            table[name], chosen[name] = price(name, topology, collective, sizes, dtype, op, params.get(name, {}),
                                              choose_chunks)
        except ValueError as exc:
            skipped[name] = str(exc).splitlines()[0]
        if progress is not None:
            progress(i + 1, len(names))
    if not table:
        raise ValueError(f"no algorithm builds {collective} on {topology.name}: "
                         + "; ".join(f"{k}: {v}" for k, v in skipped.items()))
    rows = []
    for j, n in enumerate(sizes):
        times = {name: t[j] for name, t in table.items()}
        row_params = {name: chosen[name][j] for name in table if chosen[name][j]}
        rows.append(TuneRow(n, times, min(times, key=times.get), row_params))
    return TuneTable(topology.name, topology.world_size, collective, rows, skipped, how)


__all__ = ["TuneRow", "TuneTable", "tune"]


class _CallableModule(types.ModuleType):
    """`collectives.tune` is this module and, called, `tune(...)` (as `collectives.simulate` is `simulate`)."""

    def __call__(self, *args, **kwargs) -> TuneTable:
        return tune(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
