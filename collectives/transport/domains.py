"""Scale-up domains on real runs: which ranks share a host (or an emulated NVLink domain).

By default ranks that share a host form a domain (MPI COMM_TYPE_SHARED), whatever their number and numbering:
hosts of 3 + 2 ranks, or a round-robin placement (`mpiexec -ppn 1` over hosts listed twice) give domains of
unequal size or of scattered ranks. `ranks_per_domain` overrides the hosts, to emulate NVLink domains on one
host: an integer k groups consecutive ranks 0..k-1, k..2k-1, ...; a list of integers gives the sizes of
consecutive domains ([3, 2]: ranks 0-2 and 3-4); a list of rank lists names each domain's ranks
([[0, 2, 4], [1, 3]]). On a cluster, each host's ranks form one domain, so `mpiexec -f hosts -ppn 8 -n 16`
gives 2 domains of 8.

`topology_for` turns the domains into the cluster topology the hierarchical schedules are built for: equal
domains of consecutive ranks as `cluster(domains=D, gpus_per_domain=G)`, any other grouping as a cluster with
that placement (algorithms/_uneven.py says how the schedules serve it).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

DomainSpec = int | Sequence[int] | Sequence[Sequence[int]]


def find_domains(size: int, hosts: list[list[int]],
                 ranks_per_domain: DomainSpec | None = None) -> list[list[int]]:
    """Domains as lists of ranks (each in its own order), ordered by their lowest rank: the hosts
    (host.discover), or `ranks_per_domain` (an integer, a list of domain sizes or a list of rank lists)."""
    if ranks_per_domain is None:
        return sorted(([int(r) for r in h] for h in hosts), key=min)
    if isinstance(ranks_per_domain, (int, float)) and not isinstance(ranks_per_domain, bool):
        k = int(ranks_per_domain)
        if k != ranks_per_domain or k < 1 or size % k:
            raise ValueError(f"ranks_per_domain must be a positive integer dividing the world size {size}, a list "
                             f"of domain sizes summing to {size} or a list of rank lists, got {ranks_per_domain!r}")
        return [list(range(d * k, (d + 1) * k)) for d in range(size // k)]
    try:
        items = list(ranks_per_domain)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(f"ranks_per_domain must be an integer, a list of domain sizes or a list of rank lists, "
                         f"got {ranks_per_domain!r}") from None
    if items and all(isinstance(x, int) and not isinstance(x, bool) for x in items):
        if min(items) < 1 or sum(items) != size:
            raise ValueError(f"ranks_per_domain as domain sizes must be positive and sum to the world size {size}, "
                             f"got {items!r}")
        starts = [sum(items[:i]) for i in range(len(items))]
        return [list(range(a, a + n)) for a, n in zip(starts, items, strict=True)]
    try:
        domains = [[int(r) for r in row] for row in items]
    except (TypeError, ValueError):
        raise ValueError(f"ranks_per_domain must be an integer, a list of domain sizes or a list of rank lists, "
                         f"got {ranks_per_domain!r}") from None
    flat = sorted(r for row in domains for r in row)
    if not domains or any(not row for row in domains) or flat != list(range(size)):
        raise ValueError(f"ranks_per_domain as rank lists must name every rank 0..{size - 1} exactly once, in "
                         f"non-empty domains, got {ranks_per_domain!r}")
    return sorted(domains, key=min)


def topology_for(domains: list[list[int]]):
    """A cluster topology of these domains for hierarchical schedules (needs collectives.topology.cluster):
    domain d of the list is domain d of the cluster, its ranks in its local slots in list order."""
    try:
        cluster = importlib.import_module("collectives.topology").cluster
    except (ImportError, AttributeError) as exc:
        raise ValueError("this algorithm needs a topology and collectives.topology.cluster is not available; "
                         f"pass topology= to collectives.init ({exc})") from exc
    sizes = {len(d) for d in domains}
    if len(sizes) == 1 and all(d == list(range(d[0], d[0] + len(d))) for d in domains) and \
            [d[0] for d in domains] == [i * len(domains[0]) for i in range(len(domains))]:
        return cluster(domains=len(domains), gpus_per_domain=sizes.pop())  # equal, consecutive: no placement
    return cluster(placement=[list(d) for d in domains])
