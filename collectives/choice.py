"""The chooser: the one place that picks an algorithm for a call, by the analytic model, and says why.

- `choose(collective, nbytes, topology, world_size=None, dtype, op)` -> (name, reason): what `algorithm="auto"`
  (collectives.simulate), the tuning tables (collectives.tune) and the MPI transport call (cached);
- `select(...)` -> (name, builder parameters chosen, reason);
- `select_measured(...)`: the transport's auto on a real host: what was measured there (collectives.decisions) is
  data this chooser reads, and where no measurement covers a call the model prices the candidates on the host's
  model (the loopback preset);
- `COLLECTIVES_ALGO` pins or excludes algorithms in NCCL_ALGO's syntax: "ring,double_binary_tree" (only these),
  "^chain" (all but these), "allreduce:ring;broadcast:binomial" (per collective; a clause without a prefix applies
  to every collective, a prefixed one overrides it for its collective);
- `COLLECTIVES_DEBUG=INFO` logs every choice and its reason on logging.getLogger("collectives").

What is priced. On a cluster that runs NCCL's runtime (`topology.runtime`) every candidate algorithm x protocol
(LL, LL128, Simple: the engine times each protocol the algorithm's latency class runs in and keeps the fastest,
as NCCL's tuning table does) x channel count (the topology's default, and 1 and 2, for builders with a
`channels` parameter), each pipelined builder at NCCL's chunking; the pick is the fastest, and its protocol and
channels are returned with it and named in the reason. Elsewhere (a host, `fully_connected`) an algorithm whose
builder pipelines over a `chunks` parameter is compared at its best chunk count: the chooser tries 1, 2, 4, ...
up to `TUNE_MAX_CHUNKS` chunks of at least `TUNE_MIN_CHUNK_BYTES` each, stopping at the first count that is no
faster than the previous one. Parameters given by the caller are kept as they are.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

from . import environment
from .schedule.collective import check_collective

ENV_ALGO = "COLLECTIVES_ALGO"
NATIVE = "native"  # a runtime's own collective (MPI's): a candidate of real runs, chosen from measurements only
ENV_DEBUG = "COLLECTIVES_DEBUG"
TUNE_MIN_CHUNK_BYTES = 64 << 10  # smallest pipeline chunk the tuner tries (bytes of the full buffer / chunks)
TUNE_MAX_CHUNKS = 64
# a chunk count is tried only while its schedule costs the analytic model (analysis_cost: member-rounds to
# evaluate) at most TUNE_MAX_COST_RATIO times the default's, and at most TUNE_MAX_COST unless the default costs
# more: pipelining a ring turns its one uniform round into p non-uniform ones (O(p^2) to analyse for a
# candidate that cannot win), and at full scale (331,776 GPUs) one pipelined tree costs seconds per chunk count
TUNE_MAX_COST_RATIO = 4
TUNE_MAX_COST = 4_000_000
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
    level = environment.get(ENV_DEBUG)
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
    rules = parse_algo_env(environment.get(ENV_ALGO) if env is None else env)
    rule = rules.get(collective, rules.get(None))
    if rule is None:
        return names, ""
    unknown = [n for n in rule.names if n not in algorithms.names() and n != NATIVE]
    if unknown:
        raise ValueError(f"{ENV_ALGO} names unknown algorithm(s) {', '.join(unknown)}; "
                         f"known: {', '.join(algorithms.names())}")
    kept = [n for n in names if rule.allows(n)]
    how = ("excluded " if rule.exclude else "pinned to ") + ",".join(rule.names)
    if not kept:
        raise ValueError(f"{ENV_ALGO} leaves no algorithm for {collective} ({how}); "
                         f"algorithms for {collective}: {', '.join(names)}")
    return kept, f"{ENV_ALGO} {how}"


def chunk_candidates(name: str, nbytes: int, params: dict | None = None) -> list[int]:
    """Chunk counts the chooser tries for `name` at `nbytes` off a runtime cluster (ascending; [] when it does
    not choose them): powers of two from 1 while a chunk keeps TUNE_MIN_CHUNK_BYTES, for builders with a
    `chunks` parameter (an integer default, or None: the builder's own chunking) the caller did not set, unless
    the builder plans its own (sharp: SHARP's OST quota)."""
    from .registry import parameters

    if params and "chunks" in params:
        return []
    own = parameters(name)
    if "chunks" not in own or name in OWN_CHUNKING:
        return []
    default = own["chunks"]
    if isinstance(default, bool) or not (default is None or isinstance(default, int)):
        return []
    out, c = [1], 2
    while c <= TUNE_MAX_CHUNKS and nbytes // c >= TUNE_MIN_CHUNK_BYTES:
        out.append(c)
        c *= 2
    return out


# builders that size their own pipeline from the hardware's limits (SHARP's outstanding-transaction quota)
OWN_CHUNKING = ("sharp",)
CHANNEL_TRIES = (1, 2)  # channel counts priced beside the topology's default


def describe_choice(name: str, params: dict | None) -> str:
    """`name`, or `name (LL, 16 channels)` / `name (chunks=8)` with the parameters the chooser picked."""
    if not params:
        return name
    parts = []
    if params.get("protocol"):
        parts.append(str(params["protocol"]))
    if params.get("channels"):
        parts.append(f"{params['channels']} channel{'s' if params['channels'] != 1 else ''}")
    parts += [f"{k}={v}" for k, v in sorted(params.items()) if k not in ("protocol", "channels")]
    return f"{name} ({', '.join(parts)})"


def channel_variants(name: str, topology, params: dict) -> list[dict]:
    """The channel counts priced for `name`: its default ({}), and CHANNEL_TRIES below it, for builders that
    take `channels` (unless the caller set them)."""
    from .registry import parameters

    if "channels" in params or "channels" not in parameters(name):
        return [{}]
    return [{}] + [{"channels": c} for c in CHANNEL_TRIES]


def price(name: str, topology, collective: str, sizes: list[int], dtype: str = "float32", op: str = "sum",
          params: dict | None = None, choose_chunks: bool = True) -> tuple[list[float], list[dict]]:
    """Best predicted time (analytic model) of `name` at each size, over the variants this module prices (see
    the module docstring), and the parameters that gave it (protocol and channels on a runtime cluster)."""
    from .simulator import engine

    own = dict(params or {})
    if getattr(topology, "runtime", None) is None:
        def run(ns, extra):
            return [r.time for r in engine.sweep(name, topology, ns, collective=collective, dtype=dtype,
                                                 mode="analytic", op=op, **own, **extra)]

        if choose_chunks:
            return _times_over_chunks(run, name, sizes, own,
                                      _cost_of(name, topology, collective, max(sizes), dtype, op, own))
        return run(sizes, {}), [{} for _ in sizes]
    from .registry import parameters

    takes_channels = "channels" in parameters(name)  # a builder without it reports NCCL's count, not a choice
    best = [float("inf")] * len(sizes)
    chosen: list[dict] = [{} for _ in sizes]
    for extra in channel_variants(name, topology, own):
        results = engine.sweep(name, topology, sizes, collective=collective, dtype=dtype, mode="analytic", op=op,
                               **own, **extra)
        for i, r in enumerate(results):
            if r.time < best[i]:
                best[i] = r.time
                chosen[i] = {k: v for k, v in (("protocol", r.protocol),
                                               ("channels", r.channels if takes_channels else None)) if v}
    return best, chosen


def analysis_cost(schedule) -> int:
    """Member-rounds the analytic model evaluates for `schedule`: per round iteration it costs (a uniform
    round counts once), the nodes of its phase."""
    return sum((1 if r.uniform else r.repeats) * int((ph.groups >= 0).sum())
               for ph in schedule.phases for r in ph.rounds if r.repeats)


def _times_over_chunks(run, name: str, sizes: list[int], params: dict, cost=None) -> tuple[list[float], list[dict]]:
    """Best predicted time per size over the chunk counts tried, and the parameters that gave it.

    `run(sizes, extra)` returns the predicted times at `sizes` with builder parameters {**params, **extra};
    `cost(extra)`, if given, the analysis cost of that schedule (see analysis_cost). Counts are tried in increasing
    order; a size stops at the first count no faster than the one before, and every size stops at the first
    count whose analysis costs more than the budget (TUNE_MAX_COST_RATIO, TUNE_MAX_COST)."""
    best = run(sizes, {})
    chosen: list[dict] = [{} for _ in sizes]
    cands = [chunk_candidates(name, n, params) for n in sizes]
    if not any(len(c) > 1 for c in cands):
        return best, chosen
    if cost is None:
        budget = None
    else:
        base = cost({})
        budget = min(TUNE_MAX_COST_RATIO * base, max(TUNE_MAX_COST, base))
    prev = list(best)
    live = [len(c) > 1 for c in cands]
    c = 2
    while c <= TUNE_MAX_CHUNKS:
        idx = [i for i, n in enumerate(sizes) if live[i] and c in cands[i]]
        if not idx or (budget is not None and cost({"chunks": c}) > budget):
            break
        times = run([sizes[i] for i in idx], {"chunks": c})
        for i, t in zip(idx, times, strict=True):
            if t < best[i]:
                best[i], chosen[i] = t, {"chunks": c}
            if not t < prev[i]:
                live[i] = False
            prev[i] = t
        c *= 2
    return best, chosen


def _cost_of(name: str, topology, collective: str, nbytes: int, dtype: str, op: str, params: dict):
    """cost(extra) for _times_over_chunks: analysis_cost of `name` built at `nbytes` with {**params, **extra}."""
    from .simulator.engine import build_schedule, count_for
    from .simulator.model import itemsize

    count = max(count_for(collective, nbytes, topology.world_size, itemsize(dtype)), 1)
    if collective == "reduce_scatter":
        count = max(count, topology.world_size)

    def cost(extra: dict) -> int:
        return analysis_cost(build_schedule(name, topology, collective, count, str(dtype), op, None,
                                            **params, **extra))

    return cost


def predict(names: list[str], collective: str, nbytes: int, topology, dtype: str = "float32", op: str = "sum",
            choose_chunks: bool = True, **params) -> tuple[dict[str, float], dict[str, str]]:
    """Analytic time of each algorithm that builds for this case, and why the others were left out.

    With `choose_chunks`, pipelined algorithms are timed at their best chunk count (see chunk_candidates;
    `select` and `tune` report the count chosen)."""
    times, skipped, _ = _predict(names, collective, nbytes, topology, dtype, op, choose_chunks, params)
    return times, skipped


def _predict(names, collective, nbytes, topology, dtype, op, choose_chunks, params):
    times: dict[str, float] = {}
    skipped: dict[str, str] = {}
    chosen: dict[str, dict] = {}
    for name in names:
        try:
            (t,), (extra,) = price(name, topology, collective, [int(nbytes)], dtype, op, params.get(name, {}),
                                   choose_chunks)
        except ValueError as exc:
            skipped[name] = str(exc).splitlines()[0]
            continue
        times[name] = t
        if extra:
            chosen[name] = extra
    return times, skipped, chosen


def resize(topology, world_size: int):
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
        d.pop("placement", None)  # the domain's ranks were placed for another size
        return from_dict(d)
    raise ValueError(f"{topology.name} has {topology.world_size} ranks, not {world_size}; pass a topology of "
                     f"the job's size")


@functools.lru_cache(maxsize=4096)
def _choose(collective: str, nbytes: int, topology, dtype: str, op: str, env: str | None,
            among: tuple[str, ...] | None = None) -> tuple[str, tuple, str]:
    names, how = candidates(collective, topology, env)
    if among is not None:
        names = [n for n in names if n in among]
        if not names:
            raise ValueError(f"none of the candidates {', '.join(among)} is allowed for {collective} ({how or 'all'})")
    if len(names) == 1:
        return names[0], (), f"{how} (the only allowed algorithm for {collective})"
    times, skipped, chosen = _predict(names, collective, nbytes, topology, dtype, op, True, {})
    if not times:
        raise ValueError(f"no algorithm builds {collective} on {topology.name}: "
                         + "; ".join(f"{k}: {v}" for k, v in skipped.items()))
    ranked = sorted(times, key=times.get)
    best = ranked[0]

    def label(n: str) -> str:
        return f"{describe_choice(n, chosen.get(n))} {times[n] * 1e6:,.2f} us"

    reason = f"fastest by the analytic model at {nbytes:,} B: {label(best)}"
    if len(ranked) > 1:
        reason += "; runners-up " + ", ".join(label(n) for n in ranked[1:3])
    if how:
        reason += f" ({how})"
    return best, tuple(sorted(chosen.get(best, {}).items())), reason


def select(collective: str, nbytes: int, topology, world_size: int | None = None, dtype: str = "float32",
           op: str = "sum", candidates: list[str] | tuple[str, ...] | None = None,
           **_ignored) -> tuple[str, dict, str]:
    """(algorithm, parameters chosen for it, reason): the pick of `choose`, with the protocol, channels or chunk
    count it was priced at (pass them on to simulate / the builder to run what was priced). `candidates`
    narrows the algorithms considered (COLLECTIVES_ALGO still applies)."""
    _configure_logging()
    if world_size is not None:
        topology = resize(topology, int(world_size))
    among = tuple(candidates) if candidates is not None else None
    name, chosen, reason = _choose(collective, int(nbytes), topology, str(dtype), str(op), environment.get(ENV_ALGO),
                                   among)
    log.info("%s of %d B on %s (%d ranks): %s; %s", collective, nbytes, topology.name, topology.world_size,
             describe_choice(name, dict(chosen)), reason)
    return name, dict(chosen), reason


def select_measured(collective: str, nbytes: int, topology, measured: tuple[str, dict, str] | None,
                    candidates: list[str] | tuple[str, ...] | None = None, dtype: str = "float32",
                    op: str = "sum") -> tuple[str, dict, str]:
    """auto on a real host: (algorithm, parameters, reason). What was measured there is data: `measured` =
    (algorithm or "native", parameters, where it was measured fastest), from `collectives.decisions`, wins where
    it covers the call and COLLECTIVES_ALGO allows it; otherwise the analytic model prices `candidates` on
    `topology` (the host's model) as `select` does. The caller keeps "native" out of `measured` when its runtime
    has no such collective for the call."""
    _configure_logging()
    if measured is not None:
        name, params, where = measured
        rules = parse_algo_env(environment.get(ENV_ALGO))
        rule = rules.get(collective, rules.get(None))
        if rule is None or rule.allows(name):
            shown = "MPI's own collective" if name == NATIVE else describe_choice(name, params)
            reason = f"{shown}: measured fastest at {where}; this call: {nbytes} B"
            log.info("%s of %d B (%d ranks, measured): %s", collective, nbytes, topology.world_size, reason)
            return name, dict(params), reason
        skipped = f"{ENV_ALGO} excludes {name}, measured fastest at {where}"
    else:
        skipped = "no measurement covers this call"
    name, params, reason = select(collective, nbytes, topology, dtype=dtype, op=op, candidates=candidates)
    return name, params, f"{skipped}; {reason} on {topology.name} ({topology.world_size} ranks)"


def choose(collective: str, nbytes: int, topology, world_size: int | None = None, dtype: str = "float32",
           op: str = "sum", candidates: list[str] | tuple[str, ...] | None = None, **_ignored) -> tuple[str, str]:
    """The algorithm to run for (collective, nbytes) on `topology`, and why (cached, cheap on repeat; reads
    COLLECTIVES_ALGO). The reason names the protocol, channels or chunk count it was priced at; `select`
    returns them as parameters."""
    name, _, reason = select(collective, nbytes, topology, world_size, dtype, op, candidates)
    return name, reason


__all__ = ["ENV_ALGO", "ENV_DEBUG", "TUNE_MAX_CHUNKS", "TUNE_MAX_COST", "TUNE_MAX_COST_RATIO", "TUNE_MIN_CHUNK_BYTES",
           "AlgoRule", "analysis_cost", "candidates", "channel_variants", "choose", "chunk_candidates",
           "describe_choice", "parse_algo_env", "predict", "price", "resize", "select", "select_measured"]
