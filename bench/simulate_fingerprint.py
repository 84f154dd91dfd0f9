"""Print what the simulator answers for a grid of algorithms x sizes x clusters, to full precision.

The check that a change to the simulator's speed leaves its results alone: run it before and after the change
and compare the two outputs line by line (`--compare A B` does: every figure identical, or the largest relative
difference). The grid: every registered algorithm of every collective at 4 KiB / 1 MiB / 64 MiB on small
clusters (analytic and, where it is quick, event), seven allreduce algorithms over 8 B .. 8 GiB on a 73,728-GPU
cluster (above the dataflow limit: the bulk model), and the same but collnet_chain on the full 331,776-GPU
gb300-nvl72.

Run: python bench/simulate_fingerprint.py [--quick] > out.txt;  python bench/simulate_fingerprint.py --compare a b
"""

from __future__ import annotations

import argparse
import sys

SMALL_SIZES = (4096, 1 << 20, 64 << 20)
BIG_SIZES = (8, 65536, 1 << 20, 64 << 20, 1 << 30, 8 << 30)


def _line(label: str, r) -> str:
    tiers = ",".join(f"{k}={v!r}" for k, v in sorted(r.tier_bytes.items()))
    phases = ",".join(repr(p.time) for p in r.phases)
    return (f"{label}\ttime={r.time!r}\tphases={phases}\ttiers={tiers}\tutil={r.max_link_utilization!r}\t"
            f"proto={r.protocol}\tch={r.channels}\tbottleneck={r.bottleneck}")


def _small_topologies():
    from collectives.topology import fully_connected, preset

    return [("flat-24", fully_connected(24, latency=1e-6, bandwidth=20e9, reduce_bandwidth=50e9)),
            ("dgx-h100x2", preset("dgx-h100", nodes=2)),
            ("gb200-nvl72x3x4", preset("gb200-nvl72", racks=3, gpus_per_domain=4)),
            ("gb200-nvl72x8", preset("gb200-nvl72"))]


def grid(quick: bool):
    from collectives import algorithms
    from collectives.simulate import simulate, sweep
    from collectives.topology import preset

    for tname, topo in _small_topologies():
        for collective in ("allreduce", "allgather", "reduce_scatter", "broadcast", "reduce", "alltoall"):
            for name in [*algorithms.names(collective), "auto"]:
                for n in SMALL_SIZES:
                    if collective == "alltoall":
                        unit = topo.world_size ** 2 * 4
                        n = max(unit, n // unit * unit)
                    modes = ["analytic"] + (["event"] if topo.world_size <= 24 and name != "auto" else [])
                    for mode in modes:
                        label = f"{tname}\t{collective}\t{name}\t{n}\t{mode}"
                        try:
                            r = simulate(name, topo, n, collective=collective, mode=mode)
                        except ValueError as e:
                            yield f"{label}\terror={str(e).splitlines()[0][:80]}"
                            continue
                        yield _line(label, r)
    if quick:
        return
    big = [("gb300-nvl72x1024", preset("gb300-nvl72", racks=1024)), ("gb300-nvl72", preset("gb300-nvl72"))]
    cases = [("ring", {}), ("double_binary_tree", {}), ("hierarchical", {}),
             ("hierarchical", {"intra": "nvls", "inter": "ring"}), ("nvls_tree", {}), ("sharp", {}),
             ("collnet_chain", {})]
    for tname, topo in big:
        for name, params in cases:
            if name == "collnet_chain" and topo.world_size > 100_000:
                continue  # its chains' rounds at 331,776 GPUs need more than 24 GiB of memory
            label = f"{tname}\tallreduce\t{name}{params or ''}"
            try:
                res = sweep(name, topo, BIG_SIZES, mode="analytic", **params)
            except ValueError as e:
                yield f"{label}\terror={str(e).splitlines()[0][:80]}"
                continue
            for n, r in zip(BIG_SIZES, res, strict=True):
                yield _line(f"{label}\t{n}\tanalytic", r)
            print(f"# {label} done", file=sys.stderr, flush=True)


def compare(a: str, b: str) -> int:
    import re

    with open(a) as fa, open(b) as fb:
        la, lb = fa.read().splitlines(), fb.read().splitlines()
    if len(la) != len(lb):
        print(f"{a} has {len(la)} lines, {b} {len(lb)}")
        return 1
    number = re.compile(r"-?\d+\.?\d*(?:e[-+]?\d+)?|inf|nan")
    worst, differ, text = 0.0, 0, 0
    for x, y in zip(la, lb, strict=True):
        if x == y:
            continue
        differ += 1
        nx, ny = number.findall(x), number.findall(y)
        if number.sub("#", x) != number.sub("#", y) or len(nx) != len(ny):
            text += 1
            print(f"differs in text:\n  {x}\n  {y}")
            continue
        for u, v in zip(nx, ny, strict=True):
            fu, fv = float(u), float(v)
            if fu != fv:
                worst = max(worst, abs(fu - fv) / max(abs(fu), abs(fv)))
    print(f"{len(la)} lines, {len(la) - differ} identical, {differ} differ ({text} in text); "
          f"largest relative difference of a figure {worst:.3g}")
    return 0 if text == 0 and worst <= 1e-9 else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the small clusters only")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two outputs of this script")
    args = ap.parse_args()
    if args.compare:
        return compare(*args.compare)
    for line in grid(args.quick):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
