"""`collectives verify NAME`: prove an algorithm correct over a range of world sizes; `--msccl FILE`: an MSCCL-IR
file, in every call mode it declares (in place, out of place)."""

from __future__ import annotations

import argparse
import sys

import numpy as np

from ..errors import ScheduleError
from ..registry import parse_param_value


def parse_range(text: str) -> list[int]:
    """'1-64', '8', '1,2,4-8' -> sorted list of ints."""
    out: set[int] = set()
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part:
                a, b = part.split("-", 1)
                out.update(range(int(a), int(b) + 1))
            elif part:
                out.add(int(part))
    except ValueError:
        out = set()
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"world sizes must be integers >= 1, like 1-64 or 2,4,8; got {text!r}")
    return sorted(out)


def add_parser(sub) -> None:
    p = sub.add_parser("verify", help="prove an algorithm's schedule (or an MSCCL-IR file) correct",
                       description="Build NAME's schedule for each world size and verify it symbolically; or read "
                                   "an MSCCL-IR file (--msccl FILE) and verify it in each call mode it declares.")
    p.add_argument("name", help="algorithm name (see `collectives verify --list`)", nargs="?")
    p.add_argument("--msccl", metavar="FILE", default=None,
                   help="verify an MSCCL-IR XML file instead (what MSCCLang, TACCL, TE-CCL write; RCCL and the MSCCL "
                        "executor run); errors name the GPU, threadblock and step")
    p.add_argument("--mode", choices=("both", "inplace", "outofplace"), default="both",
                   help="with --msccl: the call modes to verify (default: every mode the file declares)")
    p.add_argument("--list", action="store_true", help="list algorithms per collective and exit")
    p.add_argument("--collective", default="allreduce")
    p.add_argument("--world-sizes", type=parse_range, default=parse_range("1-16"), metavar="RANGE",
                   help="e.g. 1-64 or 2,4,8 (default 1-16)")
    p.add_argument("--count", type=int, default=None,
                   help="elements per rank (default: 3p+1, or 3p for reduce_scatter and alltoall; with --msccl: "
                        "the smallest count the executor runs the file at)")
    p.add_argument("--itemsize", type=int, default=4, help="bytes per element for the byte counts (default 4)")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="builder parameter, e.g. --param chunks=4 (repeatable)")


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


def run_msccl(args) -> int:
    from ..msccl import MscclFormatError, parse, read
    from ..verifier import verify

    try:
        algo = parse(args.msccl)
    except MscclFormatError as exc:
        print(f"collectives verify: error: {exc}", file=sys.stderr)
        return 2
    modes = [m for m, ok in (("inplace", algo.inplace), ("outofplace", algo.outofplace)) if ok]
    if args.mode != "both":
        if args.mode not in modes:
            print(f"collectives verify: error: {args.msccl} declares {' and '.join(modes)} only "
                  f"(inplace={int(algo.inplace)} outofplace={int(algo.outofplace)})", file=sys.stderr)
            return 2
        modes = [args.mode]
    print(f"# msccl {args.msccl}: {algo.name or '(no name)'}, {algo.coll} over {algo.ngpus} GPUs, proto {algo.proto}, "
          f"{algo.nchannels} channel(s), {algo.nchunksperloop} chunks per loop")
    for note in algo.notes:
        print(f"# note: {note}")
    print(f"# {'mode':>10} {'count':>8} {'rounds':>7} {'messages':>10} {'local':>7} {'max B/rank':>12}  result")
    failures = 0
    for mode in modes:
        try:
            schedule = read(args.msccl, count=args.count, inplace=mode == "inplace")
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
    params = {}
    for kv in args.param:
        if "=" not in kv:
            print(f"error: --param takes KEY=VALUE, got {kv!r}", file=sys.stderr)
            return 2
        k, v = kv.split("=", 1)
        params[k] = parse_param_value(v)
    try:
        algorithms.info(args.name)
        # usage errors that would repeat on every row: check them once, on the smallest world size
        p0 = args.world_sizes[0]
        algorithms.build(args.name, collective=args.collective, world_size=p0, **shape(args, p0), **params)
    except ValueError as exc:
        print(f"collectives verify: error: {exc}", file=sys.stderr)
        return 2
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
