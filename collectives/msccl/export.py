"""Export a registered algorithm as MSCCL-IR: build it at a count whose chunks scale with the call, then write.

An MSCCL-IR file is count-free: the executor cuts the call's elements into nchunksperloop equal chunks. A
schedule built at count n has element boundaries that are functions of n (near-equal splits); the file keeps
the algorithm's structure at every size only if those boundaries at n are the boundaries at any multiple of n
scaled (at n = p for a ring, every block is one chunk). `exact_count` finds the smallest such n among
candidates; a count given by the caller is written as it is (its chunks are then whatever that count cut).
"""

from __future__ import annotations

import numpy as np

from ..schedule import Schedule
from ..schedule.expand import expand
from .writer import write

_SMOOTH = sorted({2 ** a * 3 ** b * 5 ** c * 7 ** d for a in range(11) for b in range(7) for c in range(5)
                  for d in range(4) if 2 ** a * 3 ** b * 5 ** c * 7 ** d <= 4096})


def _build(name: str, collective: str, world_size: int, count: int, root, topology, params) -> Schedule:
    from .. import algorithms  # registers the built-ins

    return algorithms.build(name, collective=collective, world_size=world_size, count=count, root=root,
                            topology=topology, **params)


def _scales(a: Schedule, b: Schedule) -> bool:
    """b's element boundaries are exactly twice a's (same operations otherwise)."""
    if b.work_size != 2 * a.work_size:
        return False
    ta, tb = expand(a), expand(b)
    if len(ta) != len(tb):
        return False
    same = all(np.array_equal(getattr(ta, f), getattr(tb, f)) for f in ("node", "round", "kind", "peer"))
    return same and all(np.array_equal(2 * getattr(ta, f), getattr(tb, f)) for f in ("start", "stop", "remote"))


def exact_count(name: str, collective: str, world_size: int, *, root: int | None = None, topology=None,
                **params) -> int:
    """The smallest count (among multiples of world_size powers and small smooth numbers) at which `name`'s
    schedule scales with the count; ValueError if none up to the search's end (pass a count yourself)."""
    unit = world_size if collective in ("reduce_scatter", "alltoall") else 1
    candidates = sorted({unit * m * s for m in (1, world_size, world_size ** 2) for s in _SMOOTH})
    for n in candidates:
        if n > (1 << 24):
            break
        if _scales(_build(name, collective, world_size, n, root, topology, params),
                   _build(name, collective, world_size, 2 * n, root, topology, params)):
            return n
    raise ValueError(f"found no count at which {name}'s {collective} schedule scales with the count; pass a count")


def export(name: str, world_size: int, *, collective: str = "allreduce", count: int | None = None,
           root: int | None = None, topology=None, proto: str = "Simple", channels: int = 1,
           inplace: bool | None = None, min_bytes: int = 0, max_bytes: int = 0, max_steps: int | None = None,
           **params) -> str:
    """Registered algorithm `name` as MSCCL-IR XML (see `write`), built at `count` (default: `exact_count`)."""
    if count is None:
        count = exact_count(name, collective, world_size, root=root, topology=topology, **params)
    schedule = _build(name, collective, world_size, count, root, topology, params)
    extra = {} if max_steps is None else {"max_steps": max_steps}
    return write(schedule, proto=proto, channels=channels, inplace=inplace, min_bytes=min_bytes, max_bytes=max_bytes,
                 **extra)
