"""Simulator scale benchmarks (issue 5, point 3).

1. Analytic sweep of allreduce on the full gb300-nvl72 preset (331,776 GPUs): ring, double_binary_tree,
   hierarchical (nvls + sharp) and hierarchical (intra=nvls, inter=ring) over 30 sizes from 8 B to 8 GiB.
   Budget: 2 s in total (first call, nothing cached).
2. Event simulation of ring allreduce on 1,024 ranks (dgx-h100, 128 nodes: the fabric links are shared, so
   messages contend) at 64 MiB. Budget: 20 s.

Run: python bench/bench_simulate.py [--skip-event]
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def sweep_full_scale() -> float:
    from collectives.simulate import sweep
    from collectives.topology import preset

    topo = preset("gb300-nvl72")
    sizes = sorted({int(s) // 4 * 4 or 8 for s in np.geomspace(8, 8 << 30, 30)})
    cases = [("ring", {}), ("double_binary_tree", {}), ("hierarchical", {}),
             ("hierarchical", {"intra": "nvls", "inter": "ring"})]
    t0 = time.perf_counter()
    out = []
    for name, params in cases:
        t = time.perf_counter()
        res = sweep(name, topo, sizes, mode="analytic", **params)
        out.append((name, params, res, time.perf_counter() - t))
    total = time.perf_counter() - t0
    print(f"# analytic sweep: allreduce on gb300-nvl72, {topo.world_size:,} GPUs, {len(sizes)} sizes "
          f"{sizes[0]} B .. {sizes[-1]:,} B")
    for name, params, res, el in out:
        label = name + (f" ({', '.join(f'{k}={v}' for k, v in params.items())})" if params else "")
        print(f"  {label:<42} {el:6.3f} s   8 B: {res[0].time * 1e6:10.2f} us   8 GiB: busbw "
              f"{res[-1].busbw / 1e9:8.2f} GB/s   notes: {'; '.join(res[0].notes) or '-'}")
    print(f"  total {total:.3f} s (budget 2 s)")
    return total


def event_1024() -> float:
    from collectives.simulate import simulate
    from collectives.topology import preset

    topo = preset("dgx-h100", nodes=128)
    t0 = time.perf_counter()
    r = simulate("ring", topo, 64 << 20, mode="event")
    el = time.perf_counter() - t0
    a = simulate("ring", topo, 64 << 20, mode="analytic")
    print(f"# event simulation: ring allreduce of 64 MiB on dgx-h100 x 128 nodes ({topo.world_size} ranks)")
    print(f"  {el:.2f} s (budget 20 s, includes expanding every program); time {r.time * 1e6:,.1f} us, "
          f"busbw {r.busbw / 1e9:.2f} GB/s; analytic {a.time * 1e6:,.1f} us ({a.time / r.time - 1:+.2%}); "
          f"busiest link {r.max_link_utilization:.0%} busy; bottleneck {r.bottleneck}")
    return el


def agreement() -> float:
    """Event vs analytic, worst relative difference over 4 KiB, 1 MiB and 64 MiB, per topology and algorithm."""
    from collectives import algorithms
    from collectives.simulate import simulate
    from collectives.topology import fully_connected, preset

    topos = [("flat 24 (fully_connected)", fully_connected(24, latency=1e-6, bandwidth=20e9, reduce_bandwidth=50e9)),
             ("dgx-h100 x 1 (8)", preset("dgx-h100", nodes=1)), ("dgx-h100 x 4 (32)", preset("dgx-h100", nodes=4)),
             ("gb200-nvl72 x 2 (144)", preset("gb200-nvl72", racks=2)),
             ("dgx-h100 x 128 (1,024)", preset("dgx-h100", nodes=128))]
    algos = [("ring", {}), ("double_binary_tree", {}), ("recursive_doubling", {}), ("rabenseifner", {}),
             ("binomial", {}), ("chain", {}), ("nvls", {"chunks": 4}), ("sharp", {}), ("hierarchical", {"chunks": 4})]
    print("# event vs analytic: worst |analytic / event - 1| over 4 KiB, 1 MiB, 64 MiB")
    print(f"  {'topology':<24}" + "".join(f"{a:>20}" for a, _ in algos))
    worst = 0.0
    for tname, topo in topos:
        cells = []
        for name, params in algos:
            if name not in algorithms.names():
                cells.append("n/a")
                continue
            if (name == "chain" or name == "ring") and topo.world_size > 256:
                cells.append("(bench)" if name == "ring" else "-")
                continue
            try:
                dev = 0.0
                for n in (4096, 1 << 20, 64 << 20):
                    e = simulate(name, topo, n, mode="event", **params).time
                    a = simulate(name, topo, n, mode="analytic", **params).time
                    dev = max(dev, abs(a / e - 1))
                worst = max(worst, dev)
                cells.append(f"{dev:.2%}")
            except ValueError as exc:
                cells.append("-" if "domain" in str(exc) or "fabric" in str(exc) else "error")
        print(f"  {tname:<24}" + "".join(f"{c:>20}" for c in cells))
    print(f"  worst {worst:.2%}")
    return worst


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-event", action="store_true")
    ap.add_argument("--agreement", action="store_true", help="print the event-vs-analytic agreement table only")
    args = ap.parse_args()
    if args.agreement:
        return 0 if agreement() <= 0.02 else 1
    ok = sweep_full_scale() <= 2.0
    if not args.skip_event:
        ok &= event_1024() <= 20.0
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
