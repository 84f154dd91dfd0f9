"""A collective over MPI: the library's schedules vs MPI's own collective, size by size, in the same run.

    mpiexec -n 4 python bench/bench_mpi.py [--collective allreduce] [--sizes 8 1M 64M]
            [--algorithms auto ring direct:chunks=2] [--dtype float32] [--trials 7] [--seconds 0.04] [--check]
            [--all] [--comm-check off] [--inplace]

`--collective` is allreduce (default), reduce_scatter, allgather, broadcast, reduce (root 0) or alltoall; sizes
follow nccl-tests: each rank's input for allreduce, broadcast and reduce, the p·k-element input of
reduce_scatter and alltoall, the p·k-element output of allgather. MPI's own: Allreduce, Reduce_scatter_block,
Allgather, Bcast, Reduce, Alltoall. `--algorithms` defaults to auto and, for allreduce, ring, rabenseifner,
direct and recursive_doubling; for the other collectives every algorithm of theirs that runs without a topology.
`native` is MPI's own collective called through the library (the call agreement and the library's bookkeeping
around it), which is what auto runs where it picks MPI's own.

Noise-robust: for every size the candidates (MPI's own collective, `auto`, each algorithm) are measured in
*interleaved* trials (native, auto, algo1, ..., then again, the order rotated by one each time), each trial a timed loop of the same number of calls
on every rank; a trial's time is the slowest rank's mean per call. busbw = bytes x NCCL's factor / time
(allreduce 2(p-1)/p, reduce_scatter and allgather (p-1)/p, broadcast and reduce 1) from the median trial; a ratio is the median over trials of t_native / t_candidate, paired within
the trial (slow drifts of a shared machine cancel).

Prints a markdown table (size, native busbw, best algorithm and its busbw and ratio, auto's busbw, ratio and
choice); --all adds one column per algorithm. --check exits with status 1 unless the targets hold: auto >= 0.9x
native at every size measured and, for allreduce, the best algorithm >= 1.2x native for 1-16 MiB.
`--comm-check` sets the communicator's call agreement (collectives.init(check=...)); default: the library's.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import collectives.algorithms as algorithms
from mpi4py import MPI

from collectives.benchmark.compare import COLLECTIVES, buffers, bus_factor, calls, compare, label, parse_spec
from collectives.kernels._dtypes import SUPPORTED_DTYPES, dtype_name
from collectives.transport import init

DEFAULT_SIZES = ["8", "64", "512", "4K", "32K", "128K", "256K", "512K", "1M", "2M", "4M", "8M", "16M", "32M",
                 "64M"]
ALLREDUCE_ALGOS = ["auto", "ring", "rabenseifner", "direct", "recursive_doubling"]
BEST_RANGE = (1 << 20, 16 << 20)  # sizes where the best algorithm must reach BEST_TARGET
BEST_TARGET, AUTO_TARGET = 1.2, 0.9
ROOT = 0


def parse_size(s: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * mult[s[-1].upper()]) if s[-1].upper() in mult else int(s)


def human(n: int) -> str:
    for unit, m in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= m and n % m == 0:
            return f"{n // m} {unit}"
    return f"{n} B"


def default_algorithms(collective: str) -> list[str]:
    if collective == "allreduce":
        return ALLREDUCE_ALGOS
    return ["auto", *(n for n in algorithms.names(collective) if not algorithms.info(n).needs_topology)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--collective", default="allreduce", choices=COLLECTIVES)
    ap.add_argument("--sizes", nargs="+", default=DEFAULT_SIZES)
    ap.add_argument("--algorithms", nargs="+", default=None,
                    help="'auto', 'native' (MPI's own collective through the library: its agreement and bookkeeping "
                         "included) and registered algorithms, with parameters as name:key=value,... (default: auto and, "
                         "for allreduce, ring rabenseifner direct recursive_doubling; for the others every "
                         "algorithm of the collective that runs without a topology)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--trials", type=int, default=7, help="interleaved trials per size (median reported)")
    ap.add_argument("--seconds", type=float, default=0.04, help="time per trial per candidate")
    ap.add_argument("--check", action="store_true", help="exit 1 unless the speed targets hold")
    ap.add_argument("--all", action="store_true", help="one column per algorithm too")
    ap.add_argument("--inplace", action="store_true", help="in-place calls (MPI_IN_PLACE / out=x) for everyone")
    ap.add_argument("--comm-check", default=None, choices=["metadata", "full", "off"],
                    help="the communicator's call agreement (default: COLLECTIVES_CHECK or the library default)")
    args = ap.parse_args()
    comm = init(check=args.comm_check) if args.comm_check else init()
    mpi, p, rank = comm.mpi_comm, comm.size, comm.rank
    dtype = {dtype_name(d): d for d in SUPPORTED_DTYPES}[args.dtype]
    specs = [parse_spec(a) for a in (args.algorithms or default_algorithms(args.collective))]
    unknown = [n for n, _ in specs if n not in ("auto", "native") and n not in algorithms.names(args.collective)]
    if unknown:
        if rank == 0:
            print(f"bench_mpi.py: {', '.join(unknown)} cannot run {args.collective}; algorithms that can: "
                  f"{', '.join(algorithms.names(args.collective))}", file=sys.stderr)
        comm.close()
        return 2
    has_auto = any(n == "auto" for n, _ in specs)
    algos = [(n, prm) for n, prm in specs if n != "auto"]
    out = sys.stdout
    if rank == 0:
        mode = getattr(comm, "check", "n/a")
        print(f"{args.collective} {args.dtype}, {p} ranks, {MPI.Get_library_version().splitlines()[0].strip()}; busbw GB/s, "
              f"median of {args.trials} interleaved trials; call agreement: {mode}"
              f"{'; in place' if args.inplace else ''}", file=out)
        cols = ["size", "native GB/s", "best algorithm", "best GB/s", "best/native"]
        if has_auto:
            cols += ["auto GB/s", "auto/native", "auto chose"]
        if args.all:
            cols += [f"{label(n, prm)} GB/s (x)" for n, prm in algos]
        print("| " + " | ".join(cols) + " |", file=out)
        print("|" + "|".join("---:" if i and c != "best algorithm" and c != "auto chose" else "---"
                             for i, c in enumerate(cols)) + "|", file=out, flush=True)
    missed = []
    for s in args.sizes:
        nbytes = parse_size(s)
        n = max(1, nbytes // dtype.itemsize)
        if args.collective in ("reduce_scatter", "allgather", "alltoall"):  # an equal block per rank
            n = max(1, n // p) * p
        nbytes = n * dtype.itemsize
        factor = nbytes * bus_factor(args.collective, p)
        x, out_buf = buffers(args.collective, n, p, dtype, args.inplace)
        cands = calls(comm, args.collective, x, out_buf, specs, ROOT)
        result = compare(mpi, cands, args.trials, args.seconds)
        times = result.times
        choice = None
        if has_auto:
            dict(cands)["auto"]()
            choice = comm.last_choice
        if rank != 0:
            continue
        med = [statistics.median(t) for t in times]
        ratio = [statistics.median(tn / tc for tn, tc in zip(times[0], t, strict=True)) for t in times]
        bw = [factor / m / 1e9 for m in med]
        names = [c[0] for c in cands]
        algo_idx = [i for i, nm in enumerate(names) if nm not in ("native", "auto")]
        best = max(algo_idx, key=lambda i: ratio[i]) if algo_idx else None
        row = [human(nbytes), f"{bw[0]:.3f}"]
        row += [names[best], f"{bw[best]:.3f}", f"{ratio[best]:.2f}x"] if best is not None else ["-", "-", "-"]
        if has_auto:
            a = names.index("auto")
            row += [f"{bw[a]:.3f}", f"{ratio[a]:.2f}x", label(choice.algorithm, choice.params) if choice else "?"]
            if ratio[a] < AUTO_TARGET:
                missed.append(f"{human(nbytes)}: auto {ratio[a]:.2f}x < {AUTO_TARGET}x")
        if args.all:
            row += [f"{bw[i]:.3f} ({ratio[i]:.2f}x)" for i in algo_idx]
        if (args.collective == "allreduce" and best is not None and BEST_RANGE[0] <= nbytes <= BEST_RANGE[1]
                and ratio[best] < BEST_TARGET):
            missed.append(f"{human(nbytes)}: best ({names[best]}) {ratio[best]:.2f}x < {BEST_TARGET}x")
        print("| " + " | ".join(row) + " |", file=out, flush=True)
    if rank == 0 and has_auto and choice is not None:
        print(f"\nauto's reason at the last size: {choice.reason}", file=out)
    status = 0
    if rank == 0 and args.check:
        if missed:
            print("\nTARGETS MISSED:\n  " + "\n  ".join(missed), file=out)
            status = 1
        else:
            best_note = f"best >= {BEST_TARGET}x native for 1-16 MiB, " if args.collective == "allreduce" else ""
            print(f"\ntargets hold: {best_note}auto >= {AUTO_TARGET}x everywhere", file=out)
    status = mpi.bcast(status, root=0)
    comm.close()
    return status


if __name__ == "__main__":
    sys.exit(main())
