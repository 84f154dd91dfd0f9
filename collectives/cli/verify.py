"""`collectives verify NAME`: prove an algorithm correct over a range of world sizes."""

from __future__ import annotations

import argparse
import sys

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
    p = sub.add_parser("verify", help="prove an algorithm's schedule correct for a range of world sizes",
                       description="Build NAME's schedule for each world size and verify it symbolically.")
    p.add_argument("name", help="algorithm name (see `collectives verify --list`)", nargs="?")
    p.add_argument("--list", action="store_true", help="list algorithms per collective and exit")
    p.add_argument("--collective", default="allreduce")
    p.add_argument("--world-sizes", type=parse_range, default=parse_range("1-16"), metavar="RANGE",
                   help="e.g. 1-64 or 2,4,8 (default 1-16)")
    p.add_argument("--count", type=int, default=None,
                   help="elements per rank (default: 3p+1, or 3p for reduce_scatter)")
    p.add_argument("--itemsize", type=int, default=4, help="bytes per element for the byte counts (default 4)")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="builder parameter, e.g. --param chunks=4 (repeatable)")


def run(args) -> int:
    from .. import algorithms
    from ..verifier import verify

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
        algorithms.build(args.name, collective=args.collective, world_size=p0,
                         count=3 * p0 if args.collective == "reduce_scatter" else 3 * p0 + 1, **params)
    except ValueError as exc:
        print(f"collectives verify: error: {exc}", file=sys.stderr)
        return 2
    print(f"# {args.name} {args.collective}" + (f" {params}" if params else ""))
    print(f"# {'ranks':>6} {'count':>8} {'steps':>7} {'messages':>10} {'max B/rank':>12}  result")
    failures = 0
    for p in args.world_sizes:
        count = args.count if args.count is not None else (3 * p if args.collective == "reduce_scatter"
                                                           else 3 * p + 1)
        try:
            schedule = algorithms.build(args.name, collective=args.collective, world_size=p, count=count, **params)
            rep = verify(schedule, itemsize=args.itemsize)
            print(f"  {p:>6} {count:>8} {rep.steps:>7} {rep.messages:>10} {rep.max_bytes_sent_per_rank:>12}  OK",
                  flush=True)
        except (ScheduleError, ValueError) as exc:
            failures += 1
            print(f"  {p:>6} {count:>8} {'-':>7} {'-':>10} {'-':>12}  error: {exc}", flush=True)
    return 1 if failures else 0
