"""Issue 9 checks under mpiexec: `python reliability.py MODE [--timeout T]`, rank 0 prints `RESULT {json}`.

Modes
  skip         rank 1 skips a call: rank 0 times out (check off: inside the schedule, naming op index, peers,
               last completed op and sequence number; check on: in the metadata agreement)  [-n 2]
  mismatch     ranks call with different counts, dtypes, ops, roots, algorithms, collectives, or skip a call:
               every rank raises CallMismatchError naming the field; the communicator stays usable  [-n >= 2]
  bad          bad calls raise before communicating and leave x and out untouched (>= 15 cases)  [-n >= 1]
  determinism  bitwise identical results on every rank and run; deterministic=True identical across
               algorithms, chunkings and layouts; accumulate="float32" equals the emulator  [-n >= 2]
  kill         rank 1 dies inside an allreduce; survivors print `SURVIVOR rank r elapsed=.. error=..`
  daemon       ranks use sharp over switch daemons; the daemon dies (daemon_killer); ranks print SURVIVOR
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time

import ml_dtypes
import numpy as np
from mpi4py import MPI

import collectives
from collectives import algorithms, emulate
from collectives.errors import CallMismatchError
from collectives.transport import CollectiveTimeoutError, CommunicatorClosedError, init

BF16 = np.dtype(ml_dtypes.bfloat16)
WORLD = MPI.COMM_WORLD


def say(line: str) -> None:
    """Print one line in one write(2). Under PYTHONUNBUFFERED (CI sets it) print() writes the text and its
    newline separately, and mpiexec interleaves ranks' output between the two: lines from different ranks merge."""
    os.write(1, (line + "\n").encode())


def report(failures: list[str], **extra) -> None:
    gathered = WORLD.gather(failures)
    if WORLD.Get_rank() == 0:
        flat = [f for fs in gathered for f in fs]
        say("RESULT " + json.dumps({"failures": len(flat), "messages": flat, **extra}))


def mode_skip(timeout: float) -> None:
    failures, info = [], {}
    for check in ("off", "metadata"):
        comm = init(timeout=timeout, check=check)
        comm.allreduce(np.ones(64), algorithm="ring")  # call #1 everywhere
        if comm.rank == 0:
            t = time.monotonic()
            try:
                comm.allreduce(np.ones(1000), algorithm="ring")  # call #2: rank 1 skips it
                failures.append(f"check={check}: no timeout")
            except CollectiveTimeoutError as exc:
                waited = time.monotonic() - t
                msg = str(exc)
                info[check] = msg
                if not timeout * 0.9 < waited < 2 * timeout:
                    failures.append(f"check={check}: raised after {waited:.2f} s, timeout {timeout}")
                want = ["allreduce", "#2", "ring", "rank 1"]
                if check == "off":
                    want += ["op ", "last completed op", "round"]
                    if exc.op_index is None or exc.last_completed is None or exc.peers != (1,):
                        failures.append(f"check=off: attributes missing: {exc.__dict__}")
                else:
                    want += ["agreement"]
                if exc.seq != 2 or exc.collective != "allreduce" or exc.algorithm != "ring":
                    failures.append(f"check={check}: wrong attributes {exc.__dict__}")
                failures += [f"check={check}: message lacks {w!r}: {msg}" for w in want if w not in msg]
            try:
                comm.allreduce(np.ones(4))
                failures.append("a timed-out communicator accepted a call")
            except CommunicatorClosedError:
                pass
        WORLD.Barrier()  # rank 1 waits here (user traffic) instead of joining call #2
    report(failures, messages_by_check=info)


def expect_mismatch(failures, name, field, call, comm) -> None:
    try:
        call()
        failures.append(f"{name}: no error on rank {comm.rank}")
    except CallMismatchError as exc:
        msg = str(exc)
        if field not in exc.fields or field not in msg:
            failures.append(f"{name}: rank {comm.rank} error does not name {field!r}: {msg}")
    except Exception as exc:  # noqa: BLE001
        failures.append(f"{name}: rank {comm.rank} raised {type(exc).__name__}: {exc}")


def mode_mismatch(timeout: float) -> None:
    comm = init(timeout=timeout)
    r, p = comm.rank, comm.size
    odd = r == p - 1  # the last rank differs
    failures, messages = [], {}
    x = np.arange(16, dtype=np.float64)
    cases = {
        "count": ("count", lambda: comm.allreduce(x[:15] if odd else x, algorithm="ring")),
        "dtype": ("dtype", lambda: comm.allreduce(x.astype(np.float32) if odd else x, algorithm="ring")),
        "op": ("op", lambda: comm.allreduce(x, op="max" if odd else "sum", algorithm="ring")),
        "root": ("root", lambda: comm.broadcast(x.copy(), root=1 if odd else 0, algorithm="binomial")),
        "algorithm": ("algorithm", lambda: comm.allreduce(x, algorithm="binomial" if odd else "ring")),
        "collective": ("collective", lambda: comm.broadcast(x.copy()) if odd else comm.allreduce(x)),
        "native collective": ("collective", lambda: comm.barrier() if odd else comm.allreduce(x)),
        # both sides in MPI's own collective: the agreement (with its vote for MPI's blocking call) catches each field
        "native count": ("count", lambda: comm.allreduce(x[:15] if odd else x, algorithm="native")),
        "native op": ("op", lambda: comm.allreduce(x, op="max" if odd else "sum", algorithm="native")),
        "native root": ("root", lambda: comm.broadcast(x.copy(), root=1 if odd else 0, algorithm="native")),
        "native collectives": ("collective", lambda: comm.allgather(x[:8], algorithm="native") if odd
                               else comm.allreduce(x, algorithm="native")),
        "native against a schedule": ("chosen", lambda: comm.allreduce(x, algorithm="native" if odd else "ring")),
        "params": ("chosen", lambda: comm.allreduce(x, algorithm="ring", chunks=2 if odd else 1)),
        "deterministic": ("deterministic", lambda: comm.allreduce(x, deterministic=odd)),
    }
    for name, (field, call) in cases.items():
        t = time.monotonic()
        expect_mismatch(failures, name, field, call, comm)
        if time.monotonic() - t > timeout:
            failures.append(f"{name}: took {time.monotonic() - t:.2f} s")
        try:  # the communicator is still in step and usable
            got = comm.allreduce(x, algorithm="ring")
            if not np.array_equal(got, x * p):
                failures.append(f"after {name}: wrong result")
        except Exception as exc:  # noqa: BLE001
            failures.append(f"after {name}: {type(exc).__name__}: {exc}")
    # async calls are checked too
    try:
        comm.allreduce(x[:8] if odd else x, async_op=True).wait()
        failures.append("async count mismatch: no error")
    except CallMismatchError as exc:
        messages["async"] = str(exc)
    report(failures, details=messages)


def mode_bad(timeout: float) -> None:
    comm = init(timeout=timeout)
    p = comm.size
    x = np.arange(8, dtype=np.float64)
    sentinel = np.full(8, -7.0)
    out = sentinel.copy()
    ro = np.zeros(8)
    ro.flags.writeable = False
    cases = {
        "complex dtype": lambda: comm.allreduce(np.zeros(8, complex), out=out.astype(complex)),
        "object dtype": lambda: comm.allreduce(np.array([None] * 8)),
        "unknown op": lambda: comm.allreduce(x, out=out, op="xor"),
        "avg on integers": lambda: comm.allreduce(np.zeros(8, np.int32), op="avg"),
        "out wrong size": lambda: comm.allreduce(x, out=np.zeros(9)),
        "out wrong dtype": lambda: comm.allreduce(x, out=np.zeros(8, np.float32)),
        "out not contiguous": lambda: comm.allreduce(x, out=np.zeros(16)[::2]),
        "out read-only": lambda: comm.allreduce(x, out=ro),
        "broadcast read-only": lambda: comm.broadcast(ro),
        "broadcast not contiguous": lambda: comm.broadcast(np.zeros(16)[::2]),
        "root out of range": lambda: comm.reduce(x, out=out, root=p),
        "negative root": lambda: comm.broadcast(x.copy(), root=-1),
        "unknown algorithm": lambda: comm.allreduce(x, out=out, algorithm="nope"),
        "algorithm lacks collective": lambda: comm.allgather(x, algorithm="binomial"),
        "reduce_scatter not divisible": lambda: comm.reduce_scatter(np.zeros(p * 2 + 1)),
        "bad builder parameter": lambda: comm.allreduce(x, out=out, algorithm="ring", chunks=0),
        "deterministic with another algorithm": lambda: comm.allreduce(x, out=out, algorithm="ring",
                                                                       deterministic=True),
        "bad accumulate": lambda: comm.allreduce(x, out=out, accumulate="float8"),
    }
    failures, raised = [], {}
    for name, call in cases.items():
        before_x = x.copy()
        try:
            call()
            failures.append(f"{name}: no error")
        except (TypeError, ValueError) as exc:
            raised[name] = f"{type(exc).__name__}: {exc}"
        assert np.array_equal(x, before_x), f"{name}: x changed"
        assert np.array_equal(out, sentinel), f"{name}: out changed"
        assert not ro.any(), f"{name}: read-only buffer changed"
    try:
        init(check="paranoid")
        failures.append("unknown check mode accepted")
    except ValueError as exc:
        raised["unknown check mode"] = str(exc)
    if "nope" in raised.get("unknown algorithm", "") and "ring" not in raised["unknown algorithm"]:
        failures.append("unknown algorithm: the message does not list the valid ones")
    comm.close()
    try:
        comm.allreduce(x, out=out)
        failures.append("use after close: no error")
    except CommunicatorClosedError as exc:
        raised["use after close"] = str(exc)
    assert np.array_equal(out, sentinel), "use after close: out changed"
    report(failures, cases=len(cases) + 2, raised=raised)


def digest(a: np.ndarray) -> str:
    return a.view(np.uint8).tobytes().hex()


def mode_determinism(timeout: float) -> None:
    comm = init(timeout=timeout)
    r, p = comm.rank, comm.size
    failures = []
    rng = np.random.default_rng(1234 + r)
    x = (rng.standard_normal(1001) * 10.0 ** rng.integers(-3, 4, 1001)).astype(np.float32)
    everyone = WORLD.allgather(x)
    rank_order = functools.reduce(np.add, everyone)

    def same_everywhere(name, a):
        if len(set(WORLD.allgather(digest(a)))) != 1:
            failures.append(f"{name}: ranks got different bits")

    # 1) fixed algorithm: identical on every rank and on every repetition
    for name, params in (("ring", {}), ("ring", {"chunks": 3}), ("recursive_doubling", {}), ("rabenseifner", {}),
                         ("binomial", {}), ("double_binary_tree", {}), ("chain", {}), ("direct", {}),
                         ("native", {})):
        runs = [comm.allreduce(x, algorithm=name, **params) for _ in range(3)]
        if len({digest(a) for a in runs}) != 1:
            failures.append(f"{name} {params}: repeated runs differ")
        same_everywhere(f"{name} {params}", runs[0])
    # 2) deterministic=True: bitwise the rank-order fold, whatever the algorithm request, chunking and layout
    results = {"auto": comm.allreduce(x, deterministic=True)}
    for chunks in (1, 2, 7):
        results[f"direct chunks={chunks}"] = comm.allreduce(x, algorithm="direct", chunks=chunks, deterministic=True)
    if "direct" not in comm.last_choice.algorithm or "deterministic" not in comm.last_choice.reason:
        failures.append(f"last_choice does not record the deterministic choice: {comm.last_choice}")
    layouts = [1] + [k for k in (2,) if p % k == 0 and p > k]
    for k in layouts:
        c2 = init(ranks_per_domain=k, timeout=timeout, deterministic=True)
        results[f"ranks_per_domain={k}"] = c2.allreduce(x)
        c2.close()
    os.environ["COLLECTIVES_DETERMINISTIC"] = "1"
    c3 = init(timeout=timeout)
    del os.environ["COLLECTIVES_DETERMINISTIC"]
    results["COLLECTIVES_DETERMINISTIC=1"] = c3.allreduce(x)
    rs = c3.reduce_scatter(np.tile(x, p)[: p * 1001])
    if not np.array_equal(rs, np.tile(rank_order, p)[r * 1001:(r + 1) * 1001]) and p > 0:
        failures.append("deterministic reduce_scatter differs from the rank-order fold")
    red = c3.reduce(x, root=p - 1)
    if r == p - 1 and not np.array_equal(red, rank_order):
        failures.append("deterministic reduce differs from the rank-order fold")
    c3.close()
    for name, a in results.items():
        if not np.array_equal(a.view(np.uint32), rank_order.view(np.uint32)):
            failures.append(f"deterministic {name}: not bitwise the rank-order fold")
        same_everywhere(f"deterministic {name}", a)
    # 3) bfloat16: accumulate="float32" under MPI equals the emulator, and is deterministic-compatible
    xb = (rng.uniform(-1, 1, 999)).astype(BF16)
    allb = WORLD.allgather(xb)
    for algo in ("ring", "recursive_doubling"):
        sched = algorithms.build(algo, collective="allreduce", world_size=p, count=xb.size)
        for acc in (None, "float32"):
            got = comm.allreduce(xb, algorithm=algo, accumulate=acc)
            want = emulate(sched, allb, accumulate=acc)[r]
            if got.dtype != BF16 or not np.array_equal(got.view(np.uint16), want.view(np.uint16)):
                failures.append(f"bfloat16 {algo} accumulate={acc}: differs from the emulator")
    inplace = xb.copy()
    comm.allreduce(inplace, out=inplace, algorithm="ring", accumulate="float32")
    if not np.array_equal(inplace.view(np.uint16),
                          emulate(algorithms.build("ring", collective="allreduce", world_size=p, count=xb.size),
                                  allb, accumulate="float32")[r].view(np.uint16)):
        failures.append("in-place accumulate=float32 differs")
    det16 = comm.allreduce(xb, deterministic=True)
    det16_acc = comm.allreduce(xb, deterministic=True, accumulate="float32")
    if not np.array_equal(det16.view(np.uint16), det16_acc.view(np.uint16)):
        failures.append("deterministic bfloat16: accumulate float32 and default differ (direct rounds once)")
    report(failures, world_size=p)


def mode_kill(timeout: float) -> None:
    comm = init(timeout=timeout)
    x = np.ones(1 << 18)
    comm.allreduce(x, algorithm="ring")
    t = time.monotonic()
    try:
        if comm.rank != 1:  # rank 1 starts first, so it cannot run the whole call before it dies: its peers' data
            time.sleep(0.3)  # for its second round is not there yet
        work = comm.allreduce(x, algorithm="ring", chunks=4, async_op=True)
        if comm.rank == 1:
            while work._launch.stage == "agreement":  # past the call agreement: data is moving
                work.test()
            work.test()
            os._exit(3)  # dies inside the collective
        work.wait()
        say(f"SURVIVOR rank {comm.rank} elapsed={time.monotonic() - t:.2f} error=none")
    except collectives.CollectivesError as exc:
        say(f"SURVIVOR rank {comm.rank} elapsed={time.monotonic() - t:.2f} error={type(exc).__name__}: {exc}")
    sys.exit(0)  # the library ends the process without MPI_Finalize (it would block on the dead peer)


def mode_daemon(timeout: float) -> None:
    comm = init(timeout=timeout, ranks_per_domain=1)
    x = np.ones(4096)
    first = comm.allreduce(x, algorithm="sharp")  # order 1: served
    ok = np.array_equal(first, x * comm.size) and comm.daemons > 0
    t = time.monotonic()
    try:
        comm.allreduce(x, algorithm="sharp")  # order 2: the daemon dies on receiving it
        say(f"SURVIVOR rank {comm.rank} elapsed={time.monotonic() - t:.2f} first_ok={ok} error=none")
    except collectives.CollectivesError as exc:
        say(f"SURVIVOR rank {comm.rank} elapsed={time.monotonic() - t:.2f} first_ok={ok} "
            f"error={type(exc).__name__}: {exc}")
    sys.exit(0)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("skip", "mismatch", "bad", "determinism", "kill", "daemon"))
    ap.add_argument("--timeout", type=float, default=2.0)
    a = ap.parse_args()
    if a.mode != "daemon":  # (daemons do not join this barrier; their handshake has its own bound)
        WORLD.Barrier()  # every rank is past its imports: the short timeouts measure the library, not a late start
    globals()[f"mode_{a.mode}"](a.timeout)
