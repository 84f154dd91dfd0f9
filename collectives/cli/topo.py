"""`collectives topo NAME [--racks N | --nodes N | --ranks N] [--set FIELD=VALUE ...]`: print a preset."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("topo", help="print a topology preset: GPUs, domains, switches per level, bandwidths, limits",
                       description=__doc__)
    _arguments(p)
    return p


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", nargs="?", help="preset name (omit, or --list, to list presets) or a topology JSON file")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--racks", type=int, help="racks (NVL72 presets)")
    size.add_argument("--nodes", type=int, help="nodes (dgx-h100)")
    size.add_argument("--ranks", type=int, help="ranks (loopback)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a cluster parameter (JSON value, e.g. --set nic_planes=2 --set sharp=null)")
    p.add_argument("--list", action="store_true", help="list presets")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--save", metavar="FILE", help="also write the topology as JSON to FILE")


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def run(args: argparse.Namespace) -> int:
    from collectives import topology

    if args.list or not args.name:
        for name, summary in topology.presets().items():
            print(f"{name:<14} {summary}")
        return 0
    overrides: dict[str, Any] = {}
    for item in args.set:
        field, sep, value = item.partition("=")
        if not sep:
            print(f"collectives topo: --set wants FIELD=VALUE, got {item!r}", file=sys.stderr)
            return 2
        overrides[field.strip()] = _value(value)
    for alias in ("racks", "nodes", "ranks"):
        if getattr(args, alias) is not None:
            overrides[alias] = getattr(args, alias)
    try:
        if args.name.endswith(".json"):
            topo = topology.load(args.name)
            if overrides:
                data = topo.to_dict()
                size_alias = {"racks": "domains", "nodes": "domains", "ranks": "gpus_per_domain"}
                data.update({size_alias.get(k, k): v for k, v in overrides.items()})
                topo = topology.from_dict(data)
        else:
            topo = topology.preset(args.name, **overrides)
    except (ValueError, TypeError, OSError) as exc:
        print(f"collectives topo: {exc}", file=sys.stderr)
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
