"""The one syntax every `collectives` subcommand speaks: sizes, dtype, op, root, algorithms and their
parameters, topology presets, world sizes. Each subcommand adds these options through the functions below, so
a flag means the same thing, with the same help text and the same error hints, wherever it appears.

- sizes: nccl-tests' flags, `-b/--minbytes`, `-e/--maxbytes`, `-f/--stepfactor` or `-i/--stepbytes`
  (K/M/G suffixes, powers of 1024; `8`, `8B`, `64K`, `1MiB` and `8GiB` all parse);
- `-d/--datatype` (also `--dtype`): nccl-tests' names (float, half, double, bfloat16, int32, ...) or numpy's;
- `-o/--op`, `-r/--root`;
- `--algorithms ALGO[:KEY=VALUE...],...`: parameters written after the algorithm they belong to, so the same
  algorithm can appear twice with different parameters (`ring:chunks=1,ring:chunks=4`); `--param KEY=VALUE`
  (repeatable) gives KEY to every listed algorithm whose builder takes it;
- `--preset NAME` (with `--racks/--nodes/--ranks` to size it and `--set FIELD=VALUE`) or `--topology FILE`;
- `--world-sizes RANGE`: `1:64`, `1-64`, `2,4,8` or a mix.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from ..registry import parse_param_value
from ..units import parse_size as _parse_size

SIZE_HINT = "use e.g. 8, 8B, 64K, 1M, 1MiB, 8GiB"
# nccl-tests' dtype names (src/common.cu test_typenames) and short forms -> numpy's
DTYPE_ALIASES = {"half": "float16", "fp16": "float16", "float": "float32", "fp32": "float32", "double": "float64",
                 "fp64": "float64", "bf16": "bfloat16", "char": "int8", "int": "int32", "uint": "uint32"}
DTYPE_HELP = ("element type: nccl-tests' names (float, half, double, bfloat16, int8, int32, int64, uint8, ...) or "
              "numpy's (float32, float16, float64, ...); default float")
OPS = ("sum", "prod", "min", "max", "avg", "band", "bor", "bxor")
ALGORITHM_SYNTAX = "ALGO[:KEY=VALUE...],... e.g. ring:chunks=4,hierarchical:intra=nvls"


def parse_size(text: str) -> int:
    """A size as argparse's `type`: bytes with an optional K/M/G suffix; a bad one names the syntax."""
    try:
        return _parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc} ({SIZE_HINT})") from None


class _Removed(argparse.Action):
    """An option of an older dialect: refused with the flags that replace it (never silently reinterpreted)."""

    def __init__(self, option_strings, dest, hint: str = "", **kw):
        kw.setdefault("help", argparse.SUPPRESS)
        super().__init__(option_strings, dest, nargs="?", **kw)
        self.hint = hint

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} is gone: {self.hint}")


# -- sizes ---------------------------------------------------------------------------------------------------------
def add_sizes(p: argparse.ArgumentParser, minbytes: str, maxbytes: str) -> None:
    """nccl-tests' size sweep: -b, -e and -f (or -i)."""
    p.add_argument("-b", "--minbytes", type=parse_size, default=parse_size(minbytes), metavar="SIZE",
                   help=f"smallest size in bytes, K/M/G suffixes (default {minbytes})")
    p.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size(maxbytes), metavar="SIZE",
                   help=f"largest size in bytes (default {maxbytes})")
    g = p.add_mutually_exclusive_group()
    g.add_argument("-f", "--stepfactor", type=float, default=None, metavar="F",
                   help="multiply the size by F from one size to the next (default 2)")
    g.add_argument("-i", "--stepbytes", type=parse_size, default=None, metavar="SIZE",
                   help="add SIZE bytes from one size to the next instead of multiplying")
    p.add_argument("--sizes", action=_Removed, hint="give the sweep as -b MIN -e MAX [-f FACTOR], e.g. -b 8 -e 8G -f 4")


def sizes(args: argparse.Namespace) -> tuple[list[int], str]:
    """(the sweep's sizes, nccl-tests' step text) from -b/-e/-f/-i; ValueError names the flag at fault."""
    from ..units import sweep

    lo, hi = args.minbytes, args.maxbytes
    if hi < lo:
        raise ValueError(f"-e/--maxbytes {hi} is below -b/--minbytes {lo}")
    if args.stepbytes is not None:
        if args.stepbytes < 1:
            raise ValueError("-i/--stepbytes must be at least 1 byte")
        return sweep(lo, hi, increment=args.stepbytes), f"{args.stepbytes}(bytes)"
    factor = 2.0 if args.stepfactor is None else args.stepfactor
    if not factor > 1:
        raise ValueError(f"-f/--stepfactor must be > 1, got {factor:g}")
    return sweep(lo, hi, factor=factor), f"{factor:g}(factor)"


# -- dtype, op, root -----------------------------------------------------------------------------------------------
def add_dtype(p: argparse.ArgumentParser) -> None:
    p.add_argument("-d", "--datatype", "--dtype", dest="datatype", default="float", metavar="TYPE", help=DTYPE_HELP)


def dtype_name(text: str) -> str:
    """numpy's name for a -d value ('float' -> 'float32'); ValueError lists the accepted names."""
    from ..kernels._dtypes import SUPPORTED_DTYPES
    from ..kernels._dtypes import dtype_name as name_of

    known = {name_of(d) for d in SUPPORTED_DTYPES}
    name = DTYPE_ALIASES.get(text.strip().lower(), text.strip().lower())
    if name not in known:
        raise ValueError(f"unknown datatype {text!r} for -d/--datatype; choose from "
                         f"{', '.join(sorted(known | set(DTYPE_ALIASES)))}")
    return name


def add_op(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--op", default="sum", choices=OPS,
                   help="reduction operation of reducing collectives (default sum; band/bor/bxor on integers)")


def add_root(p: argparse.ArgumentParser) -> None:
    p.add_argument("-r", "--root", type=int, default=0, help="root rank of broadcast and reduce (default 0)")


def add_collective(p: argparse.ArgumentParser, default: str | None = "allreduce", extra: str = "") -> None:
    p.add_argument("--collective", default=default,
                   help=f"the collective: allreduce, reduce_scatter, allgather, broadcast, reduce, ... "
                        f"(default {default}){extra}")


# -- algorithms and their parameters -------------------------------------------------------------------------------
@dataclass
class AlgorithmSpec:
    """One entry of --algorithms: a name ("native", "auto" or a registered algorithm) and its parameters."""

    name: str
    params: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        """The entry as written on the command line: ring:chunks=4."""
        return ":".join([self.name, *(f"{k}={v}" for k, v in self.params.items())])


def add_algorithms(p: argparse.ArgumentParser, default: str | None, what: str) -> None:
    p.add_argument("--algorithms", default=default, metavar="LIST",
                   help=f"comma-separated {ALGORITHM_SYNTAX}: {what}")
    add_param(p)


def add_param(p: argparse.ArgumentParser) -> None:
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="builder parameter for every algorithm that takes KEY (repeatable), e.g. --param chunks=4; "
                        "for one algorithm only, write it after the name: --algorithms ring:chunks=4")


def parse_algorithm(item: str) -> AlgorithmSpec:
    """'ring:chunks=4:bidirectional=true' -> AlgorithmSpec('ring', {'chunks': 4, 'bidirectional': True})."""
    name, *kvs = [t.strip() for t in item.strip().split(":")]
    if "." in name and "=" in name:  # the older ALGO.KEY=VALUE
        algo, _, kv = name.partition(".")
        raise ValueError(f"{item!r}: write an algorithm's parameter after its name, {algo}:{kv}")
    params = {}
    for kv in kvs:
        key, eq, value = kv.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"parameter {kv!r} of {item!r} is not KEY=VALUE ({ALGORITHM_SYNTAX})")
        params[key.strip()] = parse_param_value(value.strip())
    return AlgorithmSpec(name, params)


def parse_params(items: list[str]) -> dict:
    """--param KEY=VALUE items -> {key: value}."""
    out = {}
    for kv in items:
        key, eq, value = kv.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"--param takes KEY=VALUE, got {kv!r}")
        if "." in key:
            algo, _, k = key.partition(".")
            raise ValueError(f"--param {kv}: for one algorithm only, write --algorithms {algo}:{k}={value}")
        out[key.strip()] = parse_param_value(value.strip())
    return out


def algorithm_specs(text: str | None, params: list[str], collective: str, default: list[str],
                    special: tuple[str, ...] = ()) -> list[AlgorithmSpec]:
    """--algorithms and --param -> specs, every name checked against the registry (and `special`: native, auto);
    each --param KEY goes to every listed algorithm whose builder takes it, and must reach one."""
    registry = _registry()
    valid = registry.names(collective)
    items = [t for t in (text.split(",") if text else default) if t.strip()]
    specs = [parse_algorithm(t) for t in items]
    if not specs:
        raise ValueError("--algorithms is empty")
    for s in specs:
        if s.name in special:
            if s.params:
                raise ValueError(f"{s.name} takes no parameters, got {s.label!r}")
        elif s.name not in valid:
            raise ValueError(f"unknown algorithm {s.name!r} for {collective}; choose from "
                             f"{', '.join([*special, *valid])} ({ALGORITHM_SYNTAX})")
        else:
            check_parameters(s.name, s.params)
    for key, value in parse_params(params).items():
        takers = [s for s in specs if s.name not in special and key in registry.parameters(s.name)]
        if not takers:
            raise ValueError(f"--param {key}: no listed algorithm has a parameter {key!r} "
                             f"({'; '.join(_parameter_list(s.name) for s in specs if s.name not in special)})")
        for s in takers:
            s.params.setdefault(key, value)
    return specs


def _registry():
    """The algorithm registry, with the built-in builders registered (importing collectives.algorithms does)."""
    from .. import algorithms, registry

    del algorithms
    return registry


def check_parameters(name: str, params: dict) -> None:
    registry = _registry()
    known = registry.parameters(name)
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise ValueError(f"{name} has no parameter {', '.join(map(repr, unknown))} ({_parameter_list(name)})")


def _parameter_list(name: str) -> str:
    registry = _registry()
    known = registry.parameters(name)
    return f"{name} takes " + (", ".join(f"{k}={v!r}" for k, v in known.items()) if known else "no parameters")


# -- topologies ----------------------------------------------------------------------------------------------------
def add_topology(p: argparse.ArgumentParser, default: str | None = "gb300-nvl72") -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--preset", default=None, metavar="NAME",
                   help="a topology preset (`collectives topo --list`)"
                        + (f"; default {default}" if default else ""))
    g.add_argument("--topology", default=None, metavar="FILE",
                   help="a topology saved as JSON (`collectives topo --save`, `collectives calibrate --out`)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--racks", type=int, default=None, help="racks of a rack preset (gb300-nvl72, gb200-nvl72)")
    size.add_argument("--nodes", type=int, default=None, help="nodes of a node preset (dgx-h100)")
    size.add_argument("--ranks", type=int, default=None, help="ranks of the loopback preset")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a cluster parameter (a JSON value; none unsets it), e.g. --set nic_bandwidth=50e9 "
                        "--set sharp=none (repeatable)")


def topology(args: argparse.Namespace, default: str | None = "gb300-nvl72"):
    """The topology --preset/--topology and the size and --set overrides describe (None: neither given and no
    default)."""
    import json

    from .. import topology as topo

    over: dict = {}
    for item in args.set:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"--set takes FIELD=VALUE, got {item!r}")
        if value.strip().lower() in ("none", "null"):
            over[key.strip()] = None  # unset the field (--set sharp=none: a fabric without SHARP)
            continue
        try:
            over[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            over[key.strip()] = value.strip()
    sizes_given = {k: getattr(args, k) for k in ("racks", "nodes", "ranks") if getattr(args, k) is not None}
    if args.topology:
        import os

        if not os.path.isfile(args.topology):
            raise FileNotFoundError(f"no topology file {args.topology}: `collectives topo --preset NAME --save FILE` "
                                    "writes one, `mpiexec -n N collectives calibrate --out FILE` one of this host")
        t = topo.load(args.topology)
        if not (over or sizes_given):
            return t
        data = t.to_dict()
        alias = {"racks": "domains", "nodes": "domains", "ranks": "gpus_per_domain"}
        data.update(over)
        data.update({alias[k]: v for k, v in sizes_given.items()})
        return topo.from_dict(data)
    name = args.preset or default
    if name is None:
        return None
    return topo.preset(name, **over, **sizes_given)


# -- world sizes ---------------------------------------------------------------------------------------------------
def parse_world_sizes(text: str) -> list[int]:
    """'1:64', '1-64', '8', '1,2,4:8' -> sorted distinct ints >= 1."""
    out: set[int] = set()
    try:
        for part in (t.strip() for t in text.split(",")):
            for sep in (":", "-"):
                if sep in part:
                    a, b = part.split(sep, 1)
                    out.update(range(int(a), int(b) + 1))
                    break
            else:
                if part:
                    out.add(int(part))
    except ValueError:
        out = set()
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"world sizes are integers >= 1, like 1:64, 1-64 or 2,4,8; got {text!r}")
    return sorted(out)


def add_world_sizes(p: argparse.ArgumentParser, default: str = "1:16") -> None:
    p.add_argument("--world-sizes", type=parse_world_sizes, default=parse_world_sizes(default), metavar="RANGE",
                   help=f"world sizes to check: MIN:MAX (also MIN-MAX), a list 2,4,8, or a mix (default {default})")


# -- the call agreement of bench and calibrate ---------------------------------------------------------------------
def add_comm_check(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--comm-check", default="off", choices=("off", "metadata", "full"),
                   help=f"the communicator's call agreement {what} (default off: the collective alone, as "
                        "nccl-tests and OSU measure MPI's; metadata, the library's default for applications, "
                        "agrees on each call's metadata first)")


__all__ = ["AlgorithmSpec", "DTYPE_ALIASES", "OPS", "add_algorithms", "add_collective", "add_comm_check",
           "add_dtype", "add_op", "add_param", "add_root", "add_sizes", "add_topology", "add_world_sizes",
           "algorithm_specs", "dtype_name", "parse_algorithm", "parse_params", "parse_size", "parse_world_sizes",
           "sizes", "topology"]
