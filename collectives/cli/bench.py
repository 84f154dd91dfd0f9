"""`collectives bench`: nccl-tests-style microbenchmarks under mpiexec, MPI's own collective side by side.

    mpiexec -n 4 collectives bench allreduce -b 8 -e 64M -f 4 --algorithms native,auto,ring,rabenseifner \\
        --predict ~/.cache/collectives/loopback.json

Flags follow nccl-tests (-b -e -f -i -n -w -c -o -d -r); sizes take K/M/G suffixes. The table is nccl-tests'
(13 standard fields per row) with the predicted time (--predict) and the algorithm as trailing columns.
Exit status: 0, 1 when any result element was wrong (-c 1), 2 on a usage error; every rank agrees.
"""

from __future__ import annotations

import argparse
import sys

from .job_errors import abort_job_on_error

COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce")


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "bench", help="nccl-tests / OSU style microbenchmark under mpiexec (MPI's own collective side by side)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("collective", choices=COLLECTIVES)
    p.add_argument("-b", "--minbytes", default="32M", help="smallest size in bytes, K/M/G suffixes (default 32M)")
    p.add_argument("-e", "--maxbytes", default="32M", help="largest size in bytes (default 32M)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("-f", "--stepfactor", type=float, default=None, help="multiply the size by this (default 2)")
    g.add_argument("-i", "--stepbytes", default=None, help="add this many bytes instead of multiplying")
    p.add_argument("-n", "--iters", type=int, default=20, help="timed iterations per size (default 20)")
    p.add_argument("-w", "--warmup_iters", type=int, default=5, help="untimed iterations first (default 5)")
    p.add_argument("-c", "--check", type=int, default=1, choices=(0, 1),
                   help="check every result against the exact reference and count wrong elements (default 1)")
    p.add_argument("-o", "--op", default="sum", choices=("sum", "prod", "min", "max", "avg"))
    p.add_argument("-d", "--datatype", default="float",
                   help="float/float32, half/float16, bfloat16, double/float64, int8, uint8, int16, uint16, "
                        "int32, uint32, int64, uint64 (default float)")
    p.add_argument("-r", "--root", type=int, default=0, help="root of broadcast/reduce (default 0)")
    p.add_argument("--algorithms", default="native,auto",
                   help="comma-separated: native (MPI's own), auto (the transport's choice), or registered "
                        "algorithm names with optional :key=value parameters, e.g. ring:chunks=4 "
                        "(default native,auto)")
    p.add_argument("--stat", default="mean", choices=("mean", "median", "min"),
                   help="time over iterations, each the slowest rank's (default mean, as nccl-tests)")
    p.add_argument("--predict", metavar="TOPOLOGY.json",
                   help="add the simulator's predicted time (us) on this saved topology (collectives calibrate "
                        "writes one); native rows read n/a, auto rows predict the algorithm auto ran")
    p.add_argument("--calibrate", action="store_true",
                   help="with --predict FILE: first measure this host in this same launch (as `collectives "
                        "calibrate --out FILE --no-default`), then predict from it, so calibration and "
                        "measurement see the machine in one state (the ranks' placement on cores is the "
                        "launch's)")
    p.add_argument("--comm-check", default="off", choices=("off", "metadata", "full"),
                   help="the communicator's call agreement (default off: the collective alone, as nccl-tests and "
                        "OSU measure MPI's; metadata, the library's default for applications, adds one small "
                        "agreement collective per call)")
    p.add_argument("--json", metavar="FILE", help="write every measurement (per-iteration times too) as JSON")
    p.add_argument("--csv", metavar="FILE", help="write every measurement as CSV")
    p.add_argument("--osu", action="store_true", help="print OSU's latency table (osu_allreduce layout) instead")
    p.add_argument("--full", action="store_true", help="with --osu: Min/Max latency and iterations columns (-f)")
    p.add_argument("--no-inplace", action="store_true", help="skip the in-place measurements (columns read N/A)")
    return p


def _options(args, world_size: int):
    import numpy as np

    from ..benchmark import format as fmt
    from ..benchmark.runner import Options, parse_algorithms
    from ..kernels._dtypes import SUPPORTED_DTYPES, dtype_name
    from ..reduction import check_op
    from ..units import parse_size, sweep

    by_name = {dtype_name(d): d for d in SUPPORTED_DTYPES}
    name = fmt.DTYPE_ALIASES.get(args.datatype.lower(), args.datatype.lower())
    if name not in by_name:
        raise ValueError(f"unknown datatype {args.datatype!r}; choose from "
                         f"{', '.join(sorted(set(by_name) | set(fmt.DTYPE_ALIASES)))}")
    dtype = np.dtype(by_name[name])
    if args.collective in fmt.REDUCING:
        check_op(args.op, dtype)
    lo, hi = parse_size(args.minbytes), parse_size(args.maxbytes)
    if args.stepbytes is not None:
        sizes, step = sweep(lo, hi, increment=parse_size(args.stepbytes)), f"{parse_size(args.stepbytes)}(bytes)"
    else:
        factor = args.stepfactor or 2
        sizes, step = sweep(lo, hi, factor=factor), f"{factor:g}(factor)"
    if args.iters < 1 or args.warmup_iters < 0:
        raise ValueError("-n must be >= 1 and -w >= 0")
    if args.collective in fmt.ROOTED and not 0 <= args.root < world_size:
        raise ValueError(f"root {args.root} is not a rank of this {world_size}-rank job")
    return Options(collective=args.collective, sizes=sizes, step=step, dtype=dtype, op=args.op, root=args.root,
                   iters=args.iters, warmup=args.warmup_iters, check=bool(args.check),
                   algorithms=parse_algorithms(args.algorithms, args.collective), stat=args.stat,
                   predict=args.predict, json_path=args.json, csv_path=args.csv, osu=args.osu, osu_full=args.full,
                   in_place=not args.no_inplace, max_bytes=hi)


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
