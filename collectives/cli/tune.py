"""`collectives tune`: the tuner's choice per size range, with the runners-up (like NCCL's tuning table)."""

from __future__ import annotations

import sys

from .simulate import Progress, add_topology_args, algo_params, load_topology, parse_sizes


def add_parser(sub) -> None:
    p = sub.add_parser("tune", help="print the algorithm the model picks per size range, with the runners-up",
                       description="Predict every candidate algorithm at every size (analytic model) and print "
                                   "which one wins where. COLLECTIVES_ALGO filters the candidates.")
    add_topology_args(p)
    p.add_argument("--collective", default="allreduce",
                   help="a collective, a comma-separated list, or 'all' (default allreduce)")
    p.add_argument("--algorithms", default=None, help="comma-separated candidates (default: all allowed)")
    p.add_argument("--sizes", type=parse_sizes, default=parse_sizes("8B:8GiB"),
                   help="MIN:MAX (x2 steps), MIN:MAX:xF, MIN:MAX:N or a list; default 8B:8GiB")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--op", default="sum")
    p.add_argument("--param", action="append", default=[], metavar="[ALGO.]KEY=VALUE",
                   help="builder parameter for the candidates that take it, e.g. --param hierarchical.inter=ring")
    p.add_argument("--progress", action="store_true", help="show a progress bar even when stderr is not a tty")


def run(args) -> int:
    from .. import choice, tune
    from ..schedule import COLLECTIVES

    topology = load_topology(args)
    colls = list(COLLECTIVES) if args.collective == "all" else [c.strip() for c in args.collective.split(",")]
    status = 0
    for i, coll in enumerate(colls):
        names = args.algorithms.split(",") if args.algorithms else choice.candidates(coll, topology)[0]
        params = algo_params(args.param, names)
        bar = Progress(len(names), f"tuning {coll}", args.progress or sys.stderr.isatty())
        try:
            table = tune.tune(topology, coll, args.sizes, algorithms=names if args.algorithms else None,
                              dtype=args.dtype, op=args.op, progress=lambda a, b, bar=bar: bar.step(), **params)
        except ValueError as exc:
            print(f"collectives tune: {coll}: {exc}", file=sys.stderr)
            status = 2
            continue
        if i:
            print()
        print(table.format())
    return status


__all__ = ["add_parser", "run"]
