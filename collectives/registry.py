"""The algorithm registry: name -> schedule builder, and the one `build` entry point.

Built-in builders live in algorithms/ (installed as collectives.algorithms), one file each, and register
themselves with `@register`. A researcher's own module registers the same way, or through the entry-point group
`collectives.algorithms` (an entry point naming a module is imported; its decorators do the rest).
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points

import numpy as np

from .schedule import Schedule
from .schedule.collective import (
    COLLECTIVES,
    ROOTED,
    alltoallv_count,
    check_collective,
    check_counts,
    check_shape,
)

Builder = Callable[..., Schedule]


@dataclass(frozen=True)
class AlgorithmInfo:
    name: str
    collectives: tuple[str, ...]
    builder: Builder
    summary: str
    needs_topology: bool = False


_REGISTRY: dict[str, AlgorithmInfo] = {}
_entry_points_loaded = False
_generation = 0  # bumped by every registration: caches of choices made from names() key on it


def generation() -> int:
    """A number that changes whenever an algorithm is registered (or replaced)."""
    _load_entry_points()
    return _generation


def register(name: str, collectives: tuple[str, ...] | list[str], *, summary: str = "",
             needs_topology: bool = False, replace: bool = False) -> Callable[[Builder], Builder]:
    """Decorator: register `builder(collective, world_size, count, *, root, topology, **params)` as `name`
    (a builder for alltoallv also receives `counts=`, the p x p matrix)."""
    for c in collectives:
        check_collective(c)

    def deco(builder: Builder) -> Builder:
        if name in _REGISTRY and not replace and _REGISTRY[name].builder is not builder:
            raise ValueError(f"algorithm {name!r} is already registered; pass replace=True to override it")
        doc = (builder.__doc__ or "").strip().splitlines()
        global _generation
        _REGISTRY[name] = AlgorithmInfo(name, tuple(collectives), builder, summary or (doc[0] if doc else ""),
                                        needs_topology)
        _generation += 1
        return builder

    return deco


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in entry_points(group="collectives.algorithms"):
        importlib.import_module(ep.value.split(":")[0])


def info(name: str) -> AlgorithmInfo:
    _load_entry_points()
    if name not in _REGISTRY:
        raise ValueError(f"unknown algorithm {name!r}; valid algorithms: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


def names(collective: str | None = None) -> list[str]:
    """Registered algorithm names, optionally only those that implement `collective`."""
    _load_entry_points()
    if collective is not None:
        check_collective(collective)
    return sorted(n for n, a in _REGISTRY.items() if collective is None or collective in a.collectives)


@functools.lru_cache(maxsize=256)
def _signature(builder) -> inspect.Signature:
    """inspect.signature is ~15 us: the transport asks for every call, so cache it per builder."""
    return inspect.signature(builder)


def parameters(name: str) -> dict[str, object]:
    """The builder's own parameters of algorithm `name`, with their defaults."""
    sig = _signature(info(name).builder)
    fixed = {"collective", "world_size", "count", "root", "topology", "counts"}
    return {k: (None if v.default is inspect.Parameter.empty else v.default)
            for k, v in sig.parameters.items() if k not in fixed and v.kind is not inspect.Parameter.VAR_KEYWORD}


def parse_param_value(text: str) -> object:
    """A builder parameter written on a command line: int, float, true/false, or the text itself."""
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def _check_params(algo: AlgorithmInfo, params: dict) -> None:
    sig = _signature(algo.builder)
    if any(v.kind is inspect.Parameter.VAR_KEYWORD for v in sig.parameters.values()):
        return
    unknown = sorted(set(params) - set(sig.parameters) - {"collective", "world_size", "count", "root", "topology",
                                                          "counts"})
    if unknown:
        valid = ", ".join(parameters(algo.name)) or "none"
        raise ValueError(f"algorithm {algo.name!r} has no parameter {', '.join(map(repr, unknown))}; "
                         f"its parameters: {valid}")


def build(name: str, *, collective: str = "allreduce", world_size: int, count: int | None = None,
          root: int | None = None, counts=None, topology=None, **params) -> Schedule:
    """Build the schedule of algorithm `name` for `collective` over `world_size` ranks.

    `count` is always the element count of each rank's input buffer (reduce_scatter and alltoall: p*k in;
    allgather: k in, p*k out). alltoallv takes `counts` instead (a p x p matrix, counts[s, d] = elements rank s
    sends to rank d; `count` may be left out). Raises ValueError naming the valid choices on an unknown name or
    collective.
    """
    check_collective(collective)
    algo = info(name)
    if collective not in algo.collectives:
        raise ValueError(f"algorithm {name!r} does not implement {collective}; it implements "
                         f"{', '.join(algo.collectives)}; algorithms for {collective}: {', '.join(names(collective))}")
    if collective in ROOTED and root is None:
        root = 0
    if collective not in ROOTED and root is not None:
        raise ValueError(f"{collective} takes no root (got root={root})")
    if collective == "alltoallv":
        if counts is None:
            raise ValueError("alltoallv needs counts=: a p x p matrix, counts[s, d] = elements rank s sends to rank d")
        counts = check_counts(counts, world_size) if isinstance(world_size, int) and world_size >= 1 else counts
        if count is None and isinstance(counts, np.ndarray):
            count = alltoallv_count(counts)
    elif count is None:
        raise ValueError(f"{collective} needs count= (elements of each rank's input)")
    check_shape(collective, world_size, count, root, counts)
    _check_params(algo, params)
    if algo.needs_topology and topology is None:
        raise ValueError(f"algorithm {name!r} needs a topology: pass topology=collectives.topology.preset(...) "
                         "or collectives.topology.cluster(...)")
    kwargs = dict(params)
    if topology is not None:
        kwargs["topology"] = topology
    if counts is not None:
        kwargs["counts"] = counts
    schedule = algo.builder(collective, world_size, count, root=root, **kwargs)
    schedule.params = {**params, **schedule.params}
    return schedule


__all__ = ["AlgorithmInfo", "COLLECTIVES", "build", "generation", "info", "names", "parameters", "parse_param_value",
           "register"]
