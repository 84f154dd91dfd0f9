"""`collectives bench`: nccl-tests-style microbenchmarks under mpiexec, MPI's own collective side by side.

    mpiexec -n 4 collectives calibrate --out loopback.json
    mpiexec -n 4 collectives bench allreduce -b 8 -e 64M -f 4 --algorithms native,auto,ring,rabenseifner \\
        --predict loopback.json

Flags follow nccl-tests (-b -e -f -i -n -w -c -o -d -r); sizes take K/M/G suffixes. The table is nccl-tests'
(13 standard fields per row) with, after them, the predicted in-place time and its error (--predict) and the
algorithm.
Exit status: 0, 1 when any result element was wrong (-c 1), 2 on a usage error; every rank agrees.
"""

from __future__ import annotations

import argparse
import sys

from . import arguments
from .job_errors import abort_job_on_error

COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce")


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "bench", help="nccl-tests / OSU style microbenchmark under mpiexec (MPI's own collective side by side)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("collective", nargs="?", choices=COLLECTIVES,
                   help="the collective to measure (or --collective, as in the other subcommands; default allreduce)")
    p.add_argument("--collective", dest="collective_option", choices=COLLECTIVES, metavar="NAME",
                   help="the collective to measure: " + ", ".join(COLLECTIVES))
    arguments.add_sizes(p, "32M", "32M")
    p.add_argument("-n", "--iters", type=int, default=20, help="timed iterations per size (default 20)")
    p.add_argument("-w", "--warmup_iters", type=int, default=5, help="untimed iterations first (default 5)")
    p.add_argument("-c", "--check", type=int, default=1, choices=(0, 1),
                   help="check every result against the exact reference and count wrong elements (default 1)")
    arguments.add_op(p)
    arguments.add_dtype(p)
    arguments.add_root(p)
    arguments.add_algorithms(p, "native,auto", "native (MPI's own collective), auto (the transport's choice) or "
                                               "registered algorithms (default native,auto)")
    p.add_argument("--stat", default="mean", choices=("mean", "median", "min"),
                   help="time over iterations, each the slowest rank's (default mean, as nccl-tests)")
    p.add_argument("--predict", metavar="FILE",
                   help="add the predicted time (us) of the in-place call and its error, from the calibration in "
                        "FILE (`collectives calibrate --out FILE` writes one); native rows read n/a, auto rows "
                        "predict the algorithm auto ran")
    p.add_argument("--calibrate", action="store_true",
                   help="with --predict FILE: first calibrate this host in this same launch (as `collectives "
                        "calibrate --out FILE`), then predict from it, so calibration and measurement see the "
                        "machine in one state")
    arguments.add_comm_check(p, "while measuring")
    p.add_argument("--json", metavar="FILE", help="write every measurement (per-iteration times too) as JSON")
    p.add_argument("--csv", metavar="FILE", help="write every measurement as CSV")
    p.add_argument("--osu", action="store_true", help="print OSU's latency table (osu_allreduce layout) instead")
    p.add_argument("--full", action="store_true",
                   help="with --osu: add the Min/Max latency and iterations columns (OSU's own -f/--full)")
    p.add_argument("--no-inplace", action="store_true", help="skip the in-place measurements (columns read N/A)")
    return p


def _options(args, world_size: int):
    import numpy as np

    from ..benchmark import format as fmt
    from ..benchmark.runner import AlgoSpec, Options
    from ..reduction import check_op

    if args.collective and args.collective_option and args.collective != args.collective_option:
        raise ValueError(f"two collectives given: {args.collective} and --collective {args.collective_option}")
    args.collective = args.collective or args.collective_option or "allreduce"
    dtype = np.dtype(_dtype(arguments.dtype_name(args.datatype)))
    if args.collective in fmt.REDUCING:
        check_op(args.op, dtype)
    sizes, step = arguments.sizes(args)
    if args.iters < 1 or args.warmup_iters < 0:
        raise ValueError("-n/--iters must be >= 1 and -w/--warmup_iters >= 0")
    if args.collective in fmt.ROOTED and not 0 <= args.root < world_size:
        raise ValueError(f"-r/--root {args.root} is not a rank of this {world_size}-rank job")
    specs = arguments.algorithm_specs(args.algorithms, args.param, args.collective, ["native", "auto"],
                                      special=("native", "auto"))
    return Options(collective=args.collective, sizes=sizes, step=step, dtype=dtype, op=args.op, root=args.root,
                   iters=args.iters, warmup=args.warmup_iters, check=bool(args.check),
                   algorithms=[AlgoSpec(s.name, s.params) for s in specs], stat=args.stat,
                   predict=args.predict, json_path=args.json, csv_path=args.csv, osu=args.osu, osu_full=args.full,
                   in_place=not args.no_inplace, max_bytes=args.maxbytes)


def _dtype(name: str):
    from ..kernels._dtypes import SUPPORTED_DTYPES, dtype_name

    return {dtype_name(d): d for d in SUPPORTED_DTYPES}[name]


def run(args) -> int:
    from ..benchmark.runner import Bench
    from ..transport import init
    from ..transport.mpi_library import MPI

    comm = init(check=args.comm_check)
    try:
        try:
            opts = _options(args, comm.size)
            if args.calibrate:
                if not args.predict:
                    raise ValueError("--calibrate needs --predict FILE (where the calibration is written)")
                _calibrate_into(comm, args.predict)
            bench = Bench(comm, opts)
        except (ValueError, TypeError, OSError) as exc:  # the same on every rank: all exit 2 together
            if comm.rank == 0:
                print(f"collectives bench: error: {exc}", file=sys.stderr)
            return 2
        with abort_job_on_error(comm.mpi_comm, "bench"):  # a rank failing alone mid-run ends the job
            status = bench.run()
        return int(comm.mpi_comm.allreduce(status, op=MPI.MAX))
    finally:
        comm.close()


def _calibrate_into(comm, path: str) -> None:
    """`collectives calibrate --out path --no-default` in this launch; every rank returns once the file exists."""
    from .calibrate import measure_and_save

    def log(msg: str) -> None:
        if comm.rank == 0:
            print(f"# calibrate: {msg}", file=sys.stderr, flush=True)

    measure_and_save(comm, [path], log=log)  # OSError on every rank if rank 0 cannot write the file
