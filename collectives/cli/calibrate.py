"""`collectives calibrate`: measure this host under mpiexec and write the loopback topology the simulator uses.

    mpiexec -n 4 collectives calibrate --out loopback.json

Writes the topology to --out (if given) and, unless --no-default, to the calibration file
`preset("loopback")` reads: $COLLECTIVES_CALIBRATION, else ~/.cache/collectives/loopback.json (see
collectives.topology.calibration_path). Calibrate with the rank count you will benchmark with: with more ranks
than cores the ranks share cores, and that is part of what gets measured.
"""

from __future__ import annotations

import argparse
import json
import sys

from .job_errors import abort_job_on_error


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("calibrate", help="measure this host under mpiexec and write a loopback topology",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", metavar="FILE", help="write the topology here (JSON, collectives.topology.load reads it)")
    p.add_argument("--no-default", action="store_true",
                   help="do not also write the default calibration file (preset('loopback') reads that one)")
    p.add_argument("--quick", action="store_true", help="fewer repetitions (for tests; noisier)")
    p.add_argument("--comm-check", default="off", choices=("off", "metadata", "full"),
                   help="the call agreement of the communicator whose fixed costs are measured: use the one "
                        "`collectives bench --comm-check` will run with (default off, as bench's)")
    p.add_argument("--json", metavar="FILE", help="also write the raw measurements as JSON")
    p.add_argument("--decisions", metavar="FILE",
                   help="instead: measure which algorithm (or MPI's own collective) is fastest here per collective "
                        "and size, and write the table auto reads into FILE (tables of other rank counts already in "
                        "FILE are kept; point COLLECTIVES_DECISIONS at it). Takes a few minutes")
    p.add_argument("--collectives", nargs="+", metavar="NAME", default=None,
                   help="with --decisions: only these collectives (default: all)")
    return p


def measure_and_save(comm, paths: list[str], quick: bool = False, json_path: str | None = None, log=None):
    """Calibrate over `comm` (every rank) and, on rank 0, write the topology with its calibration to each of
    `paths` and the raw numbers to `json_path`. Returns (numbers, topology, written paths); rank 0's paths only.
    Raises OSError on every rank if rank 0 cannot write; an error of some ranks only while measuring aborts the
    job (cli/job_errors.py)."""
    from ..benchmark.calibrate import calibrate, calibration_entry, topology_from
    from ..topology import save

    with abort_job_on_error(comm.mpi_comm, "calibrate"):  # a rank failing alone mid-measurement ends the job
        numbers = calibrate(comm, quick=quick, log=log)
        topo = topology_from(numbers)
    written, failed = [], None
    if comm.rank == 0:
        try:
            for path in paths:
                out = save(topo, path)
                data = json.loads(out.read_text())
                data["calibration"] = calibration_entry(numbers)  # raw curves: metadata, topology.load ignores it
                out.write_text(json.dumps(data, indent=2) + "\n")
                written.append(str(out))
            if json_path:
                with open(json_path, "w") as f:
                    json.dump(numbers, f, indent=1)
                    f.write("\n")
        except OSError as exc:
            failed = f"cannot write the calibration: {exc}"
    failed = comm.mpi_comm.bcast(failed, root=0)  # every rank reports rank 0's failure to write, together
    if failed:
        raise OSError(failed)
    return numbers, topo, written


def run(args) -> int:
    from ..topology import calibration_path
    from ..transport import init

    if args.decisions:
        return _decisions(args)
    comm = init(check=args.comm_check)
    try:
        def log(msg: str) -> None:
            if comm.rank == 0:
                print(f"# {msg}", file=sys.stderr, flush=True)

        targets = [args.out] if args.out else []
        if not args.no_default:
            targets.append(str(calibration_path()))
        try:
            numbers, topo, written = measure_and_save(comm, targets, args.quick, args.json, log)
        except OSError as exc:  # rank 0 could not write: raised on every rank, all exit 2 together
            if comm.rank == 0:
                print(f"collectives calibrate: error: {exc}", file=sys.stderr)
            return 2
        if comm.rank == 0:
            _report(numbers, topo, written)
        return 0
    finally:
        comm.close()


def _decisions(args) -> int:
    """calibrate --decisions FILE: measure auto's table on this host (with the default call agreement, as calls
    run) and merge it into FILE."""
    import numpy as np

    from ..benchmark import decide
    from ..benchmark.compare import COLLECTIVES
    from ..transport import init

    chosen = args.collectives or list(COLLECTIVES)
    unknown = [c for c in chosen if c not in COLLECTIVES]
    if unknown:
        raise ValueError(f"unknown collective(s) {', '.join(unknown)}; choose from {', '.join(COLLECTIVES)}")
    comm = init()
    try:
        def log(msg: str) -> None:
            if comm.rank == 0:
                print(f"# {msg}", file=sys.stderr, flush=True)

        with abort_job_on_error(comm.mpi_comm, "calibrate --decisions"):
            tables = decide.measure(comm, chosen, trials=3 if args.quick else 5,
                                    seconds=0.01 if args.quick else 0.02, log=log)
        failed = None
        if comm.rank == 0:
            try:
                path = decide.save(tables, args.decisions, decide.describe(comm, np.dtype(np.float32)))
                for t in tables:
                    rows = "; ".join(f"{'below ' + str(b) + ' B' if b else 'above'}: {a} {p or ''}".strip()
                                     for b, a, p in t["rows"])
                    print(f"{t['collective']} ({t['ranks']} ranks, {t['transport']}): {rows}")
                print(f"wrote {path}")
            except Exception as exc:  # noqa: BLE001 - reported on every rank below, never a rank left waiting
                failed = f"cannot write the decisions: {type(exc).__name__}: {exc}"
        failed = comm.mpi_comm.bcast(failed, root=0)
        if failed:
            if comm.rank == 0:
                print(f"collectives calibrate: error: {failed}", file=sys.stderr)
            return 2
        return 0
    finally:
        comm.close()


def _report(numbers: dict, topo, written: list[str]) -> None:
    p = numbers["ranks"]
    print(f"# collectives calibrate: {p} ranks, {numbers['ranks_per_host']} per host on {numbers['cores']} cores"
          f"{' (more ranks than cores)' if numbers['oversubscribed'] else ''}")
    print("# point-to-point ping-pong (one way, all pairs at once)")
    print(f"# {'size (B)':>12}  {'time (us)':>10}  {'GB/s':>8}")
    for n, t in numbers["pingpong_one_way_s"]:
        print(f"  {n:12d}  {t * 1e6:10.2f}  {n / t / 1e9 if t else 0:8.3f}")
    print(f"p2p fit                  : {numbers['p2p_latency_s'] * 1e6:.2f} us + n / {numbers['p2p_bandwidth'] / 1e9:.3f} GB/s")
    print("# exchange (every rank sends and receives n bytes at once)")
    for n, t in numbers["exchange_s"]:
        print(f"  {n:12d}  {t * 1e6:10.2f}  {n / t / 1e9 if t else 0:8.3f}")
    print(f"exchange fit             : {numbers['exchange_latency_s'] * 1e6:.2f} us + n / "
          f"{numbers['exchange_bandwidth'] / 1e9:.3f} GB/s")
    print(f"memcpy (shared memory)   : {numbers['memcpy_bandwidth'] / 1e9:.3f} GB/s per rank")
    print(f"transport round cost     : {numbers['transport_round_s'] * 1e6:.2f} us (ring allreduce of {p} floats)")
    if numbers["window_s"].get("copy_round"):
        w = numbers["window_s"]
        print(f"# the transport's rounds, us per round of D/{p} bytes (ring allgather and reduce_scatter, less the "
              "fixed costs)")
        print(f"# {'D (B)':>12}  {'copy round':>11}  {'reduce round':>12}")
        for (d, a), (_, b) in zip(w["copy_round"], w["reduce_round"], strict=True):
            print(f"  {d:12d}  {a * 1e6:11.2f}  {b * 1e6:12.2f}")
    print(f"transport fixed costs    : {numbers['round_s'] * 1e6:.2f} us per round, "
          f"{numbers['call_overhead_s'] * 1e6:.2f} us per call")
    print("reduce_into 2 inputs     : " + ", ".join(f"{k} {v / 1e9:.2f}" for k, v in numbers["reduce_bandwidth"].items())
          + " GB/s")
    spec = topo.to_dict()
    print(f"topology                 : loopback, nvlink_bandwidth {spec['nvlink_bandwidth'] / 1e9:.3f} GB/s, "
          f"nvlink_latency {spec['nvlink_latency'] * 1e6:.2f} us per hop (2 hops per message)")
    for path in written:
        print(f"wrote {path}")
