"""Small-message allreduce latency: the model against NCCL's own latency formula.

NCCL prices a call as latency + bytes / bandwidth (src/graph/tuning.cc, ncclTopoTuneModel); at 8 B the latency
is all of it. This prints, per system and algorithm, NCCL's latency (the least over the protocols the
algorithm runs in, as NCCL's tuner takes it) and the model's time at 8 B, 1 KiB and 64 KiB (analytic, the
model's defaults), and the ratio at 8 B. NCCL's formula is itself a model: measured small-message latencies,
where published (../shared/reference/published.md), win over it.

Run: python bench/nccl_latency.py
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from collectives.simulate import simulate  # noqa: E402
from collectives.topology import preset  # noqa: E402
from collectives.topology.runtime import (  # noqa: E402
    BASE_LATENCY_US,
    COLLNET_ARITY_US,
    NET_OVERHEAD_US,
    PROTOCOLS,
    SIMPLE_ONLY,
    STEP_LATENCY_US,
)

CLASS = {"ring": "ring", "double_binary_tree": "tree", "nvls": "nvls", "nvls_tree": "nvls_tree",
         "collnet_direct": "collnet_direct", "collnet_chain": "collnet_chain"}
SIZES = (8, 1 << 10, 64 << 10)


def nccl_latency_us(cls: str, ranks: int, nodes: int) -> float:
    """NCCL's allreduce latency of one algorithm (latencyInter of the graph taken as 0)."""
    ppn = ranks // nodes
    lg = int(math.log2(nodes)) if nodes > 1 else 0
    best = math.inf
    for p, proto in enumerate(PROTOCOLS):
        if cls in SIMPLE_ONLY and proto != "Simple":
            continue
        intra = STEP_LATENCY_US["nvlink"][cls][p]
        inter = STEP_LATENCY_US["net"]["tree" if ppn == 1 else cls][p]
        lat = BASE_LATENCY_US[cls][p]
        if cls == "ring":
            if nodes > 1:
                intra = max(intra, NET_OVERHEAD_US * (3 if proto == "Simple" else 1))
            inter_steps = 2 * (nodes - 1) if nodes > 1 else 0
            lat += (2 * (ranks - 1) - inter_steps) * intra + inter_steps * inter
        elif cls == "tree":
            lat += 2 * ((ppn - 1) * intra + lg * inter)
        elif cls == "collnet_direct":
            lat += 2 * (min(1, ppn - 1) * intra + (ppn - 1) * COLLNET_ARITY_US) + inter
        elif cls == "collnet_chain":
            lat += 2 * (ppn - 1) * intra + inter
        elif cls == "nvls":
            lat = intra + (inter if nodes > 1 else 0)
        elif cls == "nvls_tree":
            lat += intra + 2 * lg * inter
        best = min(best, lat)
    return best


SYSTEMS = [("dgx-h100", {"nodes": n}, n) for n in (1, 2, 4, 16)] + \
    [("gb200-nvl72", {"racks": r}, r) for r in (1, 2)]


def rows():
    for name, kw, domains in SYSTEMS:
        topo = preset(name, **kw)
        for algorithm, cls in CLASS.items():
            if (cls == "nvls" and domains > 1) or (cls in ("nvls_tree", "collnet_direct", "collnet_chain")
                                                   and domains == 1):
                continue  # NVLS spans one domain; NVLSTree and CollNet need several
            times = [simulate(algorithm, topo, n, mode="analytic").time * 1e6 for n in SIZES]
            yield name, kw, topo.world_size, algorithm, nccl_latency_us(cls, topo.world_size, domains), times


def main() -> None:
    argparse.ArgumentParser(description="Small-message allreduce latency: the model against NCCL's own latency "
                                        "formula (src/graph/tuning.cc), on the DGX H100 and GB200 NVL72 presets "
                                        "at 8 B, 1 KiB and 64 KiB.").parse_args()
    print("| system | algorithm | NCCL's formula (us) | model 8 B | model 1 KiB | model 64 KiB | model / NCCL at 8 B |")
    print("|---|---|---|---|---|---|---|")
    worst = 0.0
    for name, kw, ranks, algorithm, nccl, times in rows():
        ratio = times[0] / nccl
        worst = max(worst, ratio, 1 / ratio)
        where = ", ".join(f"{k}={v}" for k, v in kw.items())
        print(f"| {name} {where} ({ranks}) | {algorithm} | {nccl:.1f} | "
              + " | ".join(f"{t:.1f}" for t in times) + f" | {ratio:.2f} |", flush=True)
    print(f"\nWorst factor from NCCL's formula: {worst:.2f}")


if __name__ == "__main__":
    main()
