"""Schedule builders, one file per algorithm; importing this package registers the built-ins.

Public API: `names(collective)`, `build(name, collective=..., world_size=..., count=..., **params)`,
`register(name, collectives)` (decorator for your own builders), `info(name)`.
"""

from collectives.registry import AlgorithmInfo, build, info, names, register

from . import (  # noqa: F401  (registers)
    binomial,
    bruck,
    chain,
    collnet_chain,
    collnet_direct,
    direct,
    double_binary_tree,
    hierarchical,
    hierarchical_alltoall,
    nvls,
    nvls_tree,
    one_shot,
    pairwise,
    pat,
    rabenseifner,
    recursive_doubling,
    ring,
    sharp,
)

__all__ = ["AlgorithmInfo", "build", "info", "names", "register"]
