"""Scale-up domains on real runs: which ranks share a host (or an emulated NVLink domain).

By default ranks that share a host form a domain (MPI COMM_TYPE_SHARED); `ranks_per_domain=k` instead groups
consecutive ranks 0..k-1, k..2k-1, ... to emulate k-GPU NVLink domains on one host. On a cluster, each host's
ranks form one domain, so `mpiexec -f hosts -ppn 8 -n 16` gives 2 domains of 8.
"""

from __future__ import annotations

import importlib


def find_domains(size: int, hosts: list[list[int]], ranks_per_domain: int | None = None) -> list[list[int]]:
    """Domains as lists of ranks, ordered by their lowest rank: the hosts (host.discover), or consecutive groups
    of `ranks_per_domain` ranks."""
    if ranks_per_domain is not None:
        k = int(ranks_per_domain)
        if k != ranks_per_domain or k < 1 or size % k:
            raise ValueError(f"ranks_per_domain must be a positive integer dividing the world size {size}, "
                             f"got {ranks_per_domain!r}")
        return [list(range(d * k, (d + 1) * k)) for d in range(size // k)]
    return [list(h) for h in hosts]


def topology_for(domains: list[list[int]]):
    """A cluster topology of these domains for hierarchical schedules (needs collectives.topology.cluster)."""
    sizes = {len(d) for d in domains}
    if len(sizes) != 1:
        raise ValueError(f"hierarchical algorithms need equal domains; found domain sizes {sorted(sizes)}: pass "
                         "ranks_per_domain= or topology= to collectives.init")
    if any(d != list(range(d[0], d[0] + len(d))) for d in domains):
        raise ValueError("hierarchical algorithms need each domain's ranks to be consecutive; launch with "
                         "block placement (mpiexec -ppn) or pass topology= to collectives.init")
    try:
        cluster = importlib.import_module("collectives.topology").cluster
    except (ImportError, AttributeError) as exc:
        raise ValueError("this algorithm needs a topology and collectives.topology.cluster is not available; "
                         f"pass topology= to collectives.init ({exc})") from exc
    return cluster(domains=len(domains), gpus_per_domain=sizes.pop())
