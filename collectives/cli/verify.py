"""`collectives verify NAME`: prove an algorithm correct over a range of world sizes; `--msccl FILE...`: MSCCL-IR
files (or directories of them), each in every call mode it declares (in place, out of place)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from ..errors import ScheduleError
from . import arguments


def parse_range(text: str) -> list[int]:
    """'1:64', '1-64', '8', '1,2,4:8' -> sorted list of ints (arguments.parse_world_sizes)."""
    return arguments.parse_world_sizes(text)


def add_parser(sub) -> None:
    p = sub.add_parser("verify", help="prove an algorithm's schedule (or an MSCCL-IR file) correct",
                       description="Build NAME's schedule for each world size and verify it symbolically; or read "
                                   "MSCCL-IR files (--msccl FILE or DIR ...) and verify each in every call mode it declares.")
    p.add_argument("name", nargs="?",
                   help="algorithm, with parameters as in --algorithms elsewhere: ring or ring:chunks=4 "
                        "(`collectives verify --list` lists them)")
    p.add_argument("--msccl", metavar="FILE", nargs="+", default=None,
                   help="verify MSCCL-IR XML files instead (what MSCCLang, TACCL, TE-CCL write; RCCL and the MSCCL "
                        "executor run): files or directories (their *.xml); errors name the GPU, threadblock and "
                        "step")
    p.add_argument("--mode", choices=("both", "inplace", "outofplace"), default="both",
                   help="with --msccl: the call modes to verify (default: every mode the file declares)")
    p.add_argument("--list", action="store_true", help="list algorithms per collective and exit")
    arguments.add_collective(p)
    arguments.add_world_sizes(p)
    p.add_argument("--count", type=int, default=None,
                   help="elements per rank (default: 3p+1, or 3p for reduce_scatter and alltoall; with --msccl: "
                        "the smallest count the executor runs the file at)")
    p.add_argument("--itemsize", type=int, default=4, help="bytes per element for the byte counts (default 4)")
    arguments.add_param(p)


def shape(args, p: int) -> dict:
    """count= for world size p (default 3p+1, or 3p where it must divide by p); alltoallv: counts=, a fixed
    uneven matrix with empty blocks, rows and columns (counts[s, d] = (7s + 3d) mod 4, times count // 3 if
    --count is given)."""
    if args.collective == "alltoallv":
        s, d = np.meshgrid(np.arange(p), np.arange(p), indexing="ij")
        scale = 1 if args.count is None else max(args.count // 3, 1)
        return {"counts": ((7 * s + 3 * d) % 4) * scale}
    if args.count is not None:
        return {"count": args.count}
    return {"count": 3 * p if args.collective in ("reduce_scatter", "alltoall") else 3 * p + 1}


def msccl_files(paths: list[str]) -> list[Path]:
    """The files named, a directory standing for its *.xml files (sorted); ValueError for a path that is
    neither, or a directory without any."""
    files: list[Path] = []
    for text in paths:
        path = Path(text)
        if path.is_dir():
            found = sorted(path.glob("*.xml"))
            if not found:
                raise ValueError(f"{text} is a directory without *.xml files")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise ValueError(f"{text}: no such file or directory")
    return files


def run_msccl(args) -> int:
    """One block per file; with several files, a closing line counts the files that verified. Exit status: 0
    all verified, 1 some program is wrong (or, among several files, unreadable), 2 a usage error."""
    try:
        files = msccl_files(args.msccl)
    except ValueError as exc:
        print(f"collectives verify: error: {exc}", file=sys.stderr)
        return 2
    if len(files) == 1:
        return verify_msccl_file(args, files[0])
    failed = []
    for i, path in enumerate(files):
        if i:
            print()
        if verify_msccl_file(args, path, several=True) != 0:
            failed.append(path.name)
    print(f"\n# {len(files) - len(failed)} of {len(files)} files verified"
          + (f"; not verified: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def verify_msccl_file(args, path: Path, several: bool = False) -> int:
    from ..msccl import MscclFormatError, parse, read
    from ..verifier import verify

    try:
        algo = parse(path)
    except MscclFormatError as exc:
        if several:  # one unreadable file among many: reported in its place, the others still checked
            print(f"# msccl {path}: error: {exc}")
            return 1
        print(f"collectives verify: error: {exc}", file=sys.stderr)
        return 2
    modes = [m for m, ok in (("inplace", algo.inplace), ("outofplace", algo.outofplace)) if ok]
    if args.mode != "both":
        if args.mode not in modes:
            message = (f"{path} declares {' and '.join(modes)} only "
                       f"(inplace={int(algo.inplace)} outofplace={int(algo.outofplace)})")
            if several:
                print(f"# msccl {path}: error: {message}")
                return 1
            print(f"collectives verify: error: {message}", file=sys.stderr)
            return 2
        modes = [args.mode]
    print(f"# msccl {path}: {algo.name or '(no name)'}, {algo.coll} over {algo.ngpus} GPUs, proto {algo.proto}, "
          f"{algo.nchannels} channel(s), {algo.nchunksperloop} chunks per loop")
    for note in algo.notes:
        print(f"# note: {note}")
    print(f"# {'mode':>10} {'count':>8} {'rounds':>7} {'messages':>10} {'local':>7} {'max B/rank':>12}  result")
    failures = 0
    for mode in modes:
        try:
            schedule = read(path, count=args.count, inplace=mode == "inplace")
            rep = verify(schedule, itemsize=args.itemsize)
            print(f"  {mode:>10} {schedule.count:>8} {schedule.num_rounds:>7} {rep.messages:>10} {rep.local_steps:>7} "
                  f"{rep.max_bytes_sent_per_rank:>12}  OK", flush=True)
        except (ScheduleError, ValueError) as exc:
            failures += 1
            print(f"  {mode:>10} {'-':>8} {'-':>7} {'-':>10} {'-':>7} {'-':>12}  error: {exc}", flush=True)
    return 1 if failures else 0


def run(args) -> int:
    from .. import algorithms
    from ..verifier import verify

    if args.msccl:
        if args.name:
            print("collectives verify: error: give an algorithm NAME or --msccl FILE, not both", file=sys.stderr)
            return 2
        return run_msccl(args)
    if args.list or not args.name:
        from ..schedule import COLLECTIVES
        for c in COLLECTIVES:
            print(f"{c:15s} {', '.join(algorithms.names(c))}")
        return 0
    try:
        spec = arguments.parse_algorithm(args.name)
        if spec.name in algorithms.names():
            arguments.check_parameters(spec.name, spec.params)
        params = {**arguments.parse_params(args.param), **spec.params}
        algorithms.info(spec.name)
        # usage errors that would repeat on every row: check them once, on the smallest world size
        p0 = args.world_sizes[0]
        algorithms.build(spec.name, collective=args.collective, world_size=p0, **shape(args, p0), **params)
    except ValueError as exc:
        print(f"collectives verify: error: {exc}", file=sys.stderr)
        return 2
    args.name = spec.name
    print(f"# {args.name} {args.collective}" + (f" {params}" if params else ""))
    print(f"# {'ranks':>6} {'count':>8} {'steps':>7} {'messages':>10} {'max B/rank':>12}  result")
    failures = 0
    for p in args.world_sizes:
        size = shape(args, p)
        count = size["count"] if "count" in size else int(size["counts"].sum(axis=1).max(initial=0))
        try:
            schedule = algorithms.build(args.name, collective=args.collective, world_size=p, **size, **params)
            rep = verify(schedule, itemsize=args.itemsize)
            print(f"  {p:>6} {count:>8} {rep.steps:>7} {rep.messages:>10} {rep.max_bytes_sent_per_rank:>12}  OK",
                  flush=True)
        except (ScheduleError, ValueError) as exc:
            failures += 1
            print(f"  {p:>6} {count:>8} {'-':>7} {'-':>10} {'-':>12}  error: {exc}", flush=True)
    return 1 if failures else 0
