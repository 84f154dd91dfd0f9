"""The `collectives` command: one subcommand per module in this package."""

from __future__ import annotations

import argparse
import importlib
import sys

from ..errors import CollectivesError

# subcommand -> module (imported only when used, so `collectives topo` never loads MPI)
SUBCOMMANDS = {
    "verify": "collectives.cli.verify",
    "topo": "collectives.cli.topo",
    "simulate": "collectives.cli.simulate",
    "tune": "collectives.cli.tune",
    "bench": "collectives.cli.bench",
    "calibrate": "collectives.cli.calibrate",
    "export": "collectives.cli.export",
}


def _available() -> dict[str, object]:
    mods = {}
    for name, module in SUBCOMMANDS.items():
        try:
            mods[name] = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:  # a real missing dependency inside an existing subcommand
                raise
    return mods


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="collectives", description=__doc__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    mods = {wanted: importlib.import_module(SUBCOMMANDS[wanted])} if wanted else _available()
    for mod in mods.values():
        mod.add_parser(sub)
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    try:
        return int(mods[args.command].run(args) or 0)
    except (ValueError, TypeError, FileNotFoundError, CollectivesError) as exc:
        # a usage error found past argparse (unknown preset, bad parameter value, missing file): one line and
        # exit 2, as argparse does, not a traceback
        print(f"collectives {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
