"""`collectives export ALGORITHM --world-size N --format msccl`: a registered algorithm as a file for other tools.

MSCCL-IR XML runs on GPUs under the MSCCL executor for NCCL and under RCCL. The file is read back and verified
before it is written (unless --no-check), so what leaves is what `collectives verify` proved.
"""

from __future__ import annotations

import sys

from ..registry import parse_param_value
from .simulate import add_topology_args, load_topology

FORMATS = ("msccl",)


def add_parser(sub) -> None:
    p = sub.add_parser("export", help="write a registered algorithm as MSCCL-IR XML (for RCCL / the MSCCL executor)",
                       description="Build ALGORITHM for --world-size ranks and write it in --format (msccl: "
                                   "MSCCL-IR XML). The count defaults to the smallest one at which the schedule's "
                                   "chunks scale with the call's size, so the file runs at every size the executor "
                                   "accepts.")
    p.add_argument("algorithm", help="a registered algorithm (see `collectives verify --list`)")
    p.add_argument("--world-size", type=int, default=None, metavar="N",
                   help="ranks (GPUs); default: the topology's, when one is given")
    p.add_argument("--format", choices=FORMATS, default="msccl", help="output format (default msccl)")
    p.add_argument("--collective", default="allreduce")
    p.add_argument("--count", type=int, default=None,
                   help="elements per rank to build at (default: the smallest at which its chunks scale)")
    p.add_argument("--root", type=int, default=None, help="root rank of broadcast and reduce (default 0)")
    p.add_argument("--proto", choices=("Simple", "LL", "LL128"), default="Simple", help="MSCCL protocol")
    p.add_argument("--channels", type=int, default=1,
                   help="channels to spread each GPU's connections over (default 1)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--inplace", dest="inplace", action="store_true", default=None,
                      help="write the in-place program (default for allreduce-like collectives)")
    mode.add_argument("--outofplace", dest="inplace", action="store_false",
                      help="write the out-of-place program (copies the input in and the output out)")
    p.add_argument("--min-bytes", type=int, default=0, help="minBytes: smallest call the executor picks it for")
    p.add_argument("--max-bytes", type=int, default=0, help="maxBytes: largest call (0: no limit)")
    p.add_argument("--max-steps", type=int, default=None,
                   help="steps per threadblock your executor was built for (MSCCL_MAX_NUM_STEPS; default 256)")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="builder parameter, e.g. --param chunks=2 (repeatable)")
    add_topology_args(p)
    p.add_argument("--out", default=None, metavar="FILE", help="write here instead of standard output")
    p.add_argument("--no-check", action="store_true", help="skip reading the file back and verifying it")


def run(args) -> int:
    from .. import algorithms
    from ..msccl import exact_count, read, write
    from ..verifier import verify

    params = {}
    for kv in args.param:
        if "=" not in kv:
            print(f"collectives export: error: --param takes KEY=VALUE, got {kv!r}", file=sys.stderr)
            return 2
        k, v = kv.split("=", 1)
        params[k.strip()] = parse_param_value(v.strip())
    topology = load_topology(args) if args.preset or args.topology else None
    if topology is None and algorithms.info(args.algorithm).needs_topology:
        print(f"collectives export: error: {args.algorithm} needs a topology: give --preset (with --nodes, --racks "
              "or --ranks to size it) or --topology", file=sys.stderr)
        return 2
    if args.world_size is None:
        if topology is None:
            print("collectives export: error: give --world-size N (or a topology whose size it takes)", file=sys.stderr)
            return 2
        args.world_size = topology.world_size
    count = args.count
    if count is None:
        count = exact_count(args.algorithm, args.collective, args.world_size, root=args.root, topology=topology,
                            **params)
    schedule = algorithms.build(args.algorithm, collective=args.collective, world_size=args.world_size, count=count,
                                root=args.root, topology=topology, **params)
    extra = {} if args.max_steps is None else {"max_steps": args.max_steps}
    text = write(schedule, proto=args.proto, channels=args.channels, inplace=args.inplace,
                 min_bytes=args.min_bytes, max_bytes=args.max_bytes, **extra)
    if not args.no_check:
        back = read(text, count=count, inplace=None if args.inplace is None else args.inplace)
        rep = verify(back)
        print(f"collectives export: {args.algorithm} {args.collective} over {args.world_size} GPUs at count {count}: "
              f"read back and verified ({back.num_rounds} rounds, {rep.messages} messages)", file=sys.stderr)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text)
        print(f"collectives export: wrote {args.out} ({len(text)} bytes)", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


__all__ = ["add_parser", "run"]
