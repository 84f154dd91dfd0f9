"""The tuner: the one place that picks an algorithm, by the analytic model, and says why.

- `choose(collective, nbytes, topology, world_size=None, dtype, op)` -> (name, reason): what `algorithm="auto"`
  and the MPI transport call (cached);
- `tune(topology, collective, sizes)` -> TuneTable: predicted time of every candidate per size, the winner, and
  the size ranges each algorithm wins (NCCL's tuning table, readable);
- `COLLECTIVES_ALGO` pins or excludes algorithms in NCCL_ALGO's syntax: "ring,double_binary_tree" (only these),
  "^chain" (all but these), "allreduce:ring;broadcast:binomial" (per collective; a clause without a prefix applies
  to every collective, a prefixed one overrides it for its collective);
- `COLLECTIVES_DEBUG=INFO` logs every choice and its reason on logging.getLogger("collectives").
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import types
from dataclasses import dataclass, field

from .schedule.collective import check_collective

ENV_ALGO = "COLLECTIVES_ALGO"
ENV_DEBUG = "COLLECTIVES_DEBUG"
log = logging.getLogger("collectives")


@dataclass(frozen=True)
class AlgoRule:
    """One collective's filter: `names` is a whitelist, or with `exclude` a blacklist."""

    names: tuple[str, ...]
    exclude: bool

    def allows(self, name: str) -> bool:
        return (name in self.names) != self.exclude


def parse_algo_env(text: str | None) -> dict[str | None, AlgoRule]:
    """Parse NCCL_ALGO-style text into {collective or None (every collective): rule}."""
    rules: dict[str | None, AlgoRule] = {}
    for clause in (text or "").split(";"):
        clause = clause.strip()
        if not clause:
            continue
        coll: str | None = None
        if ":" in clause:
            coll, clause = (x.strip() for x in clause.split(":", 1))
            check_collective(coll)
        exclude = clause.startswith("^")
        names = tuple(n.strip() for n in clause.lstrip("^").split(",") if n.strip())
        if not names:
            raise ValueError(f"{ENV_ALGO}: empty algorithm list in clause {clause!r}")
        rules[coll] = AlgoRule(names, exclude)
    return rules


def _configure_logging() -> None:
    level = os.environ.get(ENV_DEBUG, "").upper()
    if not level or getattr(_configure_logging, "done", None) == level:
        return
    _configure_logging.done = level  # type: ignore[attr-defined]
    log.setLevel(getattr(logging, level, logging.INFO))
    if not any(getattr(h, "_collectives", False) for h in log.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("collectives %(levelname)s: %(message)s"))
        handler._collectives = True  # type: ignore[attr-defined]
        log.addHandler(handler)


def candidates(collective: str, topology, env: str | None = None) -> tuple[list[str], str]:
    """Algorithms implementing `collective` that COLLECTIVES_ALGO allows, and a note on the filter applied."""
    from . import algorithms

    check_collective(collective)
    names = algorithms.names(collective)
    rules = parse_algo_env(os.environ.get(ENV_ALGO) if env is None else env)
    rule = rules.get(collective, rules.get(None))
    if rule is None:
        return names, ""
    unknown = [n for n in rule.names if n not in algorithms.names()]
    if unknown:
        raise ValueError(f"{ENV_ALGO} names unknown algorithm(s) {', '.join(unknown)}; "
                         f"known: {', '.join(algorithms.names())}")
    kept = [n for n in names if rule.allows(n)]
    how = ("excluded " if rule.exclude else "pinned to ") + ",".join(rule.names)
    if not kept:
        raise ValueError(f"{ENV_ALGO} leaves no algorithm for {collective} ({how}); "
                         f"algorithms for {collective}: {', '.join(names)}")
    return kept, f"{ENV_ALGO} {how}"


def predict(names: list[str], collective: str, nbytes: int, topology, dtype: str = "float32", op: str = "sum",
            **params) -> tuple[dict[str, float], dict[str, str]]:
    """Analytic time of each algorithm that builds for this case, and why the others were left out."""
    from .simulate.api import simulate

    times: dict[str, float] = {}
    skipped: dict[str, str] = {}
    for name in names:
        try:
            times[name] = simulate(name, topology, nbytes, collective=collective, dtype=dtype, mode="analytic",
                                   op=op, **params.get(name, {})).time
        except (ValueError, TypeError, NotImplementedError, AttributeError) as exc:
            skipped[name] = str(exc).splitlines()[0]
    return times, skipped


def _resize(topology, world_size: int):
    """The same machine with `world_size` ranks (one-domain clusters and fully connected topologies)."""
    from .topology import from_dict

    if world_size == topology.world_size:
        return topology
    d = topology.to_dict()
    if d.get("kind") == "fully_connected":
        d["n"] = world_size
        return from_dict(d)
    if d.get("kind") == "cluster" and d.get("domains") == 1:
        d.update(gpus_per_domain=world_size, rails=None)
        return from_dict(d)
    raise ValueError(f"{topology.name} has {topology.world_size} ranks, not {world_size}; pass a topology of "
                     f"the job's size")


@functools.lru_cache(maxsize=4096)
def _choose(collective: str, nbytes: int, topology, dtype: str, op: str, env: str | None) -> tuple[str, str]:
    names, how = candidates(collective, topology, env)
    if len(names) == 1:
        return names[0], f"{how} (the only allowed algorithm for {collective})"
    times, skipped = predict(names, collective, nbytes, topology, dtype, op)
    if not times:
        raise ValueError(f"no algorithm builds {collective} on {topology.name}: "
                         + "; ".join(f"{k}: {v}" for k, v in skipped.items()))
    ranked = sorted(times, key=times.get)
    best = ranked[0]
    reason = f"fastest by the analytic model at {nbytes:,} B: {best} {times[best] * 1e6:,.2f} us"
    if len(ranked) > 1:
        reason += "; runners-up " + ", ".join(f"{n} {times[n] * 1e6:,.2f} us" for n in ranked[1:3])
    if how:
        reason += f" ({how})"
    return best, reason


def choose(collective: str, nbytes: int, topology, world_size: int | None = None, dtype: str = "float32",
           op: str = "sum", **_ignored) -> tuple[str, str]:
    """The algorithm to run for (collective, nbytes) on `topology`, and why (cached; reads COLLECTIVES_ALGO)."""
    _configure_logging()
    if world_size is not None:
        topology = _resize(topology, int(world_size))
    name, reason = _choose(collective, int(nbytes), topology, str(dtype), str(op), os.environ.get(ENV_ALGO))
    log.info("%s of %d B on %s (%d ranks): %s; %s", collective, nbytes, topology.name, topology.world_size, name,
             reason)
    return name, reason


@dataclass
class TuneRow:
    nbytes: int
    times: dict[str, float]  # seconds per algorithm
    winner: str


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
        from .cli.simulate import format_size

        lines = [f"# collectives tuning table: {self.collective} on {self.topology} ({self.world_size:,} ranks), "
                 "analytic model"]
        if self.note:
            lines.append(f"# {self.note}")
        lines.append(f"# {'size range':<23} {'choice':<22} {'time(us)':>12}   runners-up: time(us)")
        by_size = {r.nbytes: r for r in self.rows}
        for lo, hi, name in self.ranges():
            rng = format_size(lo) if lo == hi else f"{format_size(lo)} - {format_size(hi)}"
            row = by_size[hi]
            others = sorted((n for n in row.times if n != name), key=row.times.get)
            runners = ", ".join(f"{n} {row.times[n] * 1e6:,.2f}" for n in others[:3])
            lines.append(f"  {rng:<23} {name:<22} {row.times[name] * 1e6:>12,.2f}   {runners} (at {format_size(hi)})")
        for name, why in self.skipped.items():
            lines.append(f"# not a candidate: {name}: {why}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


def tune(topology, collective: str = "allreduce", sizes=None, algorithms: list[str] | None = None,
         dtype: str = "float32", op: str = "sum", progress=None, **params) -> TuneTable:
    """Predict every candidate at every size (bytes; default 8 B..8 GiB by powers of 2) and tabulate winners.

    `params` maps an algorithm name to its builder parameters, e.g. hierarchical={"inter": "ring"}.
    """
    from .simulate.api import resolve_topology, sweep

    topology = resolve_topology(topology)
    sizes = [8 << i for i in range(31)] if sizes is None else [int(s) for s in sizes]
    if algorithms is None:
        names, how = candidates(collective, topology)
    else:
        names, how = list(algorithms), ""
    table: dict[str, list[float]] = {}
    skipped: dict[str, str] = {}
    for i, name in enumerate(names):
        try:
            res = sweep(name, topology, sizes, collective=collective, dtype=dtype, mode="analytic", op=op,
                        **params.get(name, {}))
            table[name] = [r.time for r in res]
        except (ValueError, TypeError, NotImplementedError, AttributeError) as exc:
            skipped[name] = str(exc).splitlines()[0]
        if progress is not None:
            progress(i + 1, len(names))
    if not table:
        raise ValueError(f"no algorithm builds {collective} on {topology.name}: "
                         + "; ".join(f"{k}: {v}" for k, v in skipped.items()))
    rows = []
    for j, n in enumerate(sizes):
        times = {name: t[j] for name, t in table.items()}
        rows.append(TuneRow(n, times, min(times, key=times.get)))
    return TuneTable(topology.name, topology.world_size, collective, rows, skipped, how)


__all__ = ["ENV_ALGO", "ENV_DEBUG", "AlgoRule", "TuneRow", "TuneTable", "candidates", "choose", "parse_algo_env",
           "predict", "tune"]


class _CallableModule(types.ModuleType):
    """`collectives.tune` is this module and, called, `tune(...)` (as `collectives.simulate` is `simulate`)."""

    def __call__(self, *args, **kwargs) -> TuneTable:
        return tune(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
