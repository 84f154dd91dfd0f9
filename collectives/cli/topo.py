"""`collectives topo --preset NAME [--racks N | --nodes N | --ranks N] [--set FIELD=VALUE ...]`: print a preset
(or a saved topology: --topology FILE). `collectives topo NAME` works too."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from . import arguments


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("topo", help="print a topology preset: GPUs, domains, switches per level, bandwidths, limits",
                       description=__doc__)
    _arguments(p)
    return p


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", nargs="?",
                   help="a preset or a topology JSON file, as --preset NAME or --topology FILE (omit to list presets)")
    arguments.add_topology(p, default=None)
    p.add_argument("--list", action="store_true", help="list presets")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--save", metavar="FILE", help="also write the topology as JSON to FILE")


def run(args: argparse.Namespace) -> int:
    from collectives import topology

    if args.name:
        if args.preset or args.topology:
            print("collectives topo: error: give the topology once: NAME, --preset NAME or --topology FILE",
                  file=sys.stderr)
            return 2
        if args.name.endswith(".json"):
            args.topology = args.name
        else:
            args.preset = args.name
    if args.list or not (args.preset or args.topology):
        for name, summary in topology.presets().items():
            print(f"{name:<14} {summary}")
        return 0
    try:
        topo = arguments.topology(args, default=None)
    except (ValueError, TypeError, OSError) as exc:
        print(f"collectives topo: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        summary = topo.summary() if hasattr(topo, "summary") else topo.to_dict()
        print(json.dumps(summary, indent=2))
    else:
        print(topo.describe())
    if args.save:
        print(f"saved to {topology.save(topo, args.save)}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="collectives topo", description=__doc__)
    _arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
