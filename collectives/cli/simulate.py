"""`collectives simulate`: nccl-tests-style tables of predicted times, one per algorithm, on a modelled cluster."""

from __future__ import annotations

import csv
import json
import sys

from . import arguments

TYPE_NAMES = {"float32": "float", "float64": "double", "float16": "half", "bfloat16": "bfloat16", "int32": "int32",
              "int64": "int64", "uint8": "uint8", "int8": "int8", "uint32": "uint32", "uint64": "uint64"}


class Progress:
    """A one-line progress bar on stderr (only when stderr is a terminal, or forced)."""

    def __init__(self, total: int, label: str, enabled: bool) -> None:
        self.total, self.label, self.enabled, self.done = total, label, enabled, 0

    def step(self, n: int = 1) -> None:
        self.done += n
        if self.enabled:
            width = 30
            fill = int(width * self.done / max(self.total, 1))
            sys.stderr.write(f"\r{self.label} [{'#' * fill}{'.' * (width - fill)}] {self.done}/{self.total}")
            if self.done >= self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()


def add_parser(sub) -> None:
    p = sub.add_parser("simulate", help="predict collective times on a modelled cluster (nccl-tests-style tables)",
                       description="Simulate algorithms over a range of sizes and print one nccl-tests-style table "
                                   "per algorithm; '*' marks the fastest algorithm at each size.")
    arguments.add_topology(p)
    arguments.add_collective(p, default=None, extra=": allreduce, or the --msccl file's collective")
    arguments.add_algorithms(p, None, "'auto' (the tuner's choice per size) or registered algorithms (default: every "
                                      "algorithm of the collective)")
    p.add_argument("--msccl", action="append", default=[], metavar="FILE",
                   help="also time an MSCCL-IR file (repeatable), in the same table; sizes the MSCCL executor would "
                        "not run it at (count x multiplier not a multiple of nchunksperloop) are marked")
    arguments.add_sizes(p, "8", "8G")
    arguments.add_dtype(p)
    arguments.add_op(p)
    p.add_argument("--mode", choices=("auto", "event", "analytic"), default="analytic",
                   help="analytic (rounds costed vectorized; default), event (every message as a discrete event), "
                        "or auto (event where it is cheap)")
    p.add_argument("--protocol", default=None, choices=("LL", "LL128", "Simple"),
                   help="NCCL protocol on clusters that run NCCL's runtime (default: the fastest per size, as NCCL)")
    p.add_argument("--trace", default=None, metavar="FILE.json",
                   help="write the event simulation of the first algorithm at the largest size as a Chrome trace "
                        "(open in Perfetto: one process per rank, one track per channel or link)")
    p.add_argument("--csv", default=None, metavar="FILE", help="also write every row as CSV")
    p.add_argument("--json", default=None, metavar="FILE", help="also write every result as JSON")
    p.add_argument("--plot", default=None, metavar="FILE.png", help="draw busbw against size (needs matplotlib)")
    p.add_argument("--progress", action="store_true", help="show a progress bar even when stderr is not a tty")


def msccl_results(paths: list[str], topology, sizes: list[int], args, bar) -> dict[str, list]:
    """Per MSCCL-IR file: a SimulationResult per size, or the reason the executor would not run it there."""
    from ..msccl import parse, read
    from ..simulate import simulate
    from ..simulator.engine import count_for
    from ..simulator.model import itemsize

    out: dict[str, list] = {}
    for path in paths:
        algo = parse(path)
        if algo.coll != args.collective:
            raise ValueError(f"{path} is an {algo.coll}, not an {args.collective}")
        if algo.ngpus != topology.world_size:
            raise ValueError(f"{path} is for {algo.ngpus} GPUs but {topology.name} has {topology.world_size}; size "
                             "the preset with --nodes, --racks or --ranks")
        rows: list = []
        for n in sizes:
            try:
                schedule = read(path, count=count_for(args.collective, n, topology.world_size, itemsize(args.dtype)))
                rows.append(simulate(schedule, topology, n, dtype=args.dtype, mode=args.mode, op=args.op))
            except ValueError as exc:
                rows.append(str(exc).split(";")[0])
            bar.step()
        out[f"msccl:{path.rsplit('/', 1)[-1]}"] = rows
    return out


def run(args) -> int:
    from .. import algorithms
    from ..msccl import parse
    from ..simulate import sweep
    from ..simulator.engine import check_call
    from ..simulator.model import itemsize
    from ..simulator.result import bus_factor

    if args.collective is None:
        args.collective = parse(args.msccl[0]).coll if args.msccl else "allreduce"
    args.dtype = arguments.dtype_name(args.datatype)
    args.sizes, _ = arguments.sizes(args)
    check_call(args.sizes[0] if args.sizes else 0, args.dtype, args.op, args.collective)
    topology = arguments.topology(args)
    specs = arguments.algorithm_specs(args.algorithms, args.param, args.collective,
                                      algorithms.names(args.collective), special=("auto",))
    labels = [s.label for s in specs]
    if len(set(labels)) < len(labels):
        raise ValueError(f"--algorithms lists one entry twice: {', '.join(labels)}")
    sizes = args.sizes
    bar = Progress((len(specs) + len(args.msccl)) * len(sizes), "simulating", args.progress or sys.stderr.isatty())
    results: dict[str, list] = {}
    failed: dict[str, str] = {}
    for spec in specs:
        try:
            kw = dict(spec.params)
            if args.protocol is not None:
                kw["protocol"] = args.protocol
            results[spec.label] = sweep(spec.name, topology, sizes, collective=args.collective, dtype=args.dtype,
                                        mode=args.mode, op=args.op, progress=lambda i, n: bar.step(), **kw)
        except (ValueError, TypeError, NotImplementedError, AttributeError) as exc:
            failed[spec.label] = str(exc).splitlines()[0]
            bar.step(len(sizes))
    results.update(msccl_results(args.msccl, topology, sizes, args, bar))
    if not results:
        for n, why in failed.items():
            print(f"collectives simulate: {n}: {why}", file=sys.stderr)
        return 2
    ran = lambda r: not isinstance(r, str)  # noqa: E731  (a string: why an MSCCL file does not run at that size)
    best = {i: min((n for n in results if ran(results[n][i])), key=lambda n: results[n][i].time, default=None)
            for i in range(len(sizes))}
    root = 0 if args.collective in ("broadcast", "reduce") else -1
    tname = TYPE_NAMES.get(args.dtype, args.dtype)
    print(f"# collectives simulate: {args.collective} on {topology.name} ({topology.world_size:,} ranks), "
          f"{args.dtype}, op {args.op}, mode {args.mode}")
    print("# sizes follow nccl-tests: the full buffer (allgather: output, reduce_scatter: input); "
          "busbw = algbw x " + f"{bus_factor(args.collective, topology.world_size):.4f}")
    for name, res in results.items():
        print(f"#\n# algorithm: {name}" + ("  (the tuner's choice per size: see the last column)"
                                             if name == "auto" else ""))
        notes = sorted({n for r in res if ran(r) for n in r.notes})
        for n in notes:
            print(f"# note: {n}")
        print(f"# {'size':>10} {'count':>12} {'type':>8} {'redop':>6} {'root':>6} {'time(us)':>12} "
              f"{'algbw(GB/s)':>12} {'busbw(GB/s)':>12} {'proto':>6} {'ch':>4}  winner  bottleneck")
        for i, r in enumerate(res):
            if not ran(r):
                print(f"  {sizes[i]:>10d} {'-':>12} {tname:>8} {args.op:>6} {root:>6} {'-':>12} {'-':>12} {'-':>12}"
                      f" {'-':>6} {'-':>4}  {'':^6}  not run: {r}")
                continue
            mark = "*" if best[i] == name else ""
            print(f"  {r.nbytes:>10d} {r.count:>12d} {tname:>8} {args.op:>6} {root:>6} {r.time * 1e6:>12.2f} "
                  f"{r.algbw / 1e9:>12.2f} {r.busbw / 1e9:>12.2f} {r.protocol or '-':>6} {r.channels or '-':>4}  "
                  f"{mark:^6}  " + (f"[{r.algorithm}] " if name == "auto" else "") + r.bottleneck)
        done = [r for r in res if ran(r)]
        avg = sum(r.busbw for r in done) / max(len(done), 1)
        print(f"# Avg bus bandwidth    : {avg / 1e9:.4f}")
    for n, why in failed.items():
        print(f"# skipped {n}: {why}")
    rows = [dict(algorithm=name, size=r.nbytes, count=r.count, type=tname, redop=args.op, root=root,
                 time_us=r.time * 1e6, algbw_GBps=r.algbw / 1e9, busbw_GBps=r.busbw / 1e9,
                 protocol=r.protocol or "", channels=r.channels or "", winner=best[i] == name,
                 bottleneck=r.bottleneck, mode=r.mode)
            for name, res in results.items() for i, r in enumerate(res) if ran(r)]
    if args.csv:
        with open(args.csv, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"topology": topology.name, "world_size": topology.world_size, "collective": args.collective,
                       "dtype": args.dtype, "itemsize": itemsize(args.dtype), "results": [
                           r.to_dict() for res in results.values() for r in res if ran(r)]}, fh, indent=1)
    if args.trace:
        write_trace(args, topology, labels, results)
    if args.plot:
        return plot(results, args.plot, f"{args.collective} on {topology.name} ({topology.world_size:,} ranks)")
    return 0


def write_trace(args, topology, names: list[str], results: dict) -> None:
    """--trace: the event simulation of the first simulated algorithm at the largest size, as a Chrome trace."""
    from ..simulate import simulate
    from ..simulator.trace import write_chrome_trace

    name = next(n for n in names if n in results)
    last = results[name][-1]
    kw = {k: v for k, v in last.params.items() if k in ("chunks", "channels")}
    res = simulate(last.algorithm, topology, last.nbytes, collective=args.collective, dtype=args.dtype,
                   mode="event", op=args.op, protocol=last.protocol, trace=True, **kw)
    path = write_chrome_trace(res, args.trace)
    print(f"# trace: {path} ({res.algorithm}, {res.nbytes:,} B, event model; open in https://ui.perfetto.dev)")


def plot(results: dict, path: str, title: str) -> int:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("collectives simulate: --plot needs matplotlib: pip install 'collectives[plot]' "
              "(or pip install matplotlib)", file=sys.stderr)
        return 3
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, res in results.items():
        res = [r for r in res if not isinstance(r, str)]
        ax.plot([r.nbytes for r in res], [r.busbw / 1e9 for r in res], marker="o", ms=3, label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return 0


__all__ = ["Progress", "add_parser", "run"]
