"""`collectives tune`: the tuner's choice per size range, with the runners-up (like NCCL's tuning table)."""

from __future__ import annotations

import sys

from . import arguments
from .simulate import Progress


def add_parser(sub) -> None:
    p = sub.add_parser("tune", help="print the algorithm the model picks per size range, with the runners-up",
                       description="Predict every candidate algorithm at every size (analytic model) and print "
                                   "which one wins where. COLLECTIVES_ALGO filters the candidates.")
    arguments.add_topology(p)
    arguments.add_collective(p, extra="; a comma-separated list, or 'all'")
    arguments.add_algorithms(p, None, "the candidates (default: every algorithm the tuner may choose, filtered by "
                                      "COLLECTIVES_ALGO); one entry per algorithm")
    arguments.add_sizes(p, "8", "8G")
    arguments.add_dtype(p)
    arguments.add_op(p)
    p.add_argument("--progress", action="store_true", help="show a progress bar even when stderr is not a tty")


def run(args) -> int:
    from .. import choice, tune
    from ..schedule import COLLECTIVES

    topology = arguments.topology(args)
    dtype = arguments.dtype_name(args.datatype)
    sizes, _ = arguments.sizes(args)
    colls = list(COLLECTIVES) if args.collective == "all" else [c.strip() for c in args.collective.split(",")]
    status = 0
    for i, coll in enumerate(colls):
        default = choice.candidates(coll, topology)[0]
        specs = arguments.algorithm_specs(args.algorithms, args.param, coll, default)
        names = [s.name for s in specs]
        if len(set(names)) < len(names):
            raise ValueError(f"--algorithms lists {', '.join(names)}: the tuner compares one entry per algorithm")
        params = {s.name: s.params for s in specs}
        bar = Progress(len(names), f"tuning {coll}", args.progress or sys.stderr.isatty())
        try:
            table = tune.tune(topology, coll, sizes, algorithms=names if args.algorithms else None,
                              dtype=dtype, op=args.op, progress=lambda a, b, bar=bar: bar.step(), **params)
        except ValueError as exc:
            print(f"collectives tune: {coll}: {exc}", file=sys.stderr)
            status = 2
            continue
        if i:
            print()
        print(table.format())
    return status


__all__ = ["add_parser", "run"]
