"""Run under mpiexec: every registered algorithm x collective x dtype x op through the Communicator, checked.

Each case's output must be (1) bitwise the emulator's output for the same schedule and inputs (every rank can
make every rank's input: one rank per case, in turn, emulates it and keeps a digest of every rank's emulated
output, each rank keeps a digest of its own, and one allgather at the end compares them all), (2) equal to MPI's
own collective on the same inputs (bitwise for integers, close for floats; bfloat16 against MPI float32; the
inputs depend on the collective, dtype, op, count and root only, so one MPI call serves every algorithm), (3)
bitwise identical across ranks where every rank gets the same result. Async handles, in-place and `out=`
variants, and a test-only "star" in-network allreduce (switch node p) run too; with switch daemons in
MPI_COMM_WORLD the star runs on them.

Prints one line `RESULT {json}` on rank 0; exit status 1 on any failure.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
import traceback
import zlib

import collectives.algorithms as algorithms
import numpy as np
from mpi4py import MPI

from collectives.emulator import emulate
from collectives.kernels._dtypes import BFLOAT16, dtype_name
from collectives.registry import register
from collectives.schedule import ChunkTable, Phase, Round, Schedule, recv, recv_reduce, send
from collectives.transport import init

DTYPES = [np.dtype(np.int32), np.dtype(np.int64), np.dtype(np.float32), np.dtype(np.float64),
          np.dtype(np.float16), BFLOAT16]
REF_OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX, "avg": MPI.SUM}


@register("star", ("allreduce",), summary="test only: every rank sends segment s to switch node p + s % switches, "
          "which reduces and sends the result back (in-network reduction in its simplest form)", replace=True)
def build_star(collective, world_size, count, *, root=None, topology=None, chunks: int = 1,
               switches: int = 1) -> Schedule:
    p, k, c = world_size, int(switches), int(chunks)
    members = np.arange(p + k, dtype=np.int64)[None, :]  # members p.. are the switch nodes
    table = ChunkTable.whole(count, 1, c)

    def serving(m, it):  # switch member m handles segment it
        return (np.asarray(m) >= p) & (np.asarray(m) - p == np.asarray(it) % k)

    def up(m, it):  # ranks send segment `it`; its switch stores rank 0's, then reduces ranks 1..p-1 in order
        on = serving(m, it)
        return [send(np.where(np.asarray(m) < p, p + np.asarray(it) % k, -1), it), recv(np.where(on, 0, -1), it)] + \
               [recv_reduce(np.where(on, i, -1), it) for i in range(1, p)]

    def down(m, it):
        on = serving(m, it)
        return [send(np.where(on, i, -1), it) for i in range(p)] + \
               [recv(np.where(np.asarray(m) < p, p + np.asarray(it) % k, -1), it)]

    phase = Phase("star", members, table, [Round(up, repeats=c), Round(down, repeats=c)])
    return Schedule("star", collective, p, count, [phase], num_nodes=p + k, params={"chunks": c, "switches": k},
                    node_labels={p + i: f"switch {i}" for i in range(k)})


def make_input(seed: int, rank: int, n: int, dtype: np.dtype, op: str) -> np.ndarray:
    rng = np.random.default_rng([seed, rank])
    if dtype.kind in "iu":
        lo, hi = (-3, 4) if op == "prod" else (-1000, 1000)
        return rng.integers(lo, hi, n).astype(dtype)
    if op == "prod":
        return rng.uniform(0.5, 1.5, n).astype(np.float32).astype(dtype)
    return rng.standard_normal(n).astype(np.float32).astype(dtype)


def tolerance(dtype: np.dtype, p: int) -> float:
    return {2: 0.05, 4: 1e-4, 8: 1e-10}[dtype.itemsize] * p if dtype.kind == "f" or dtype == BFLOAT16 else 0.0


class Checker:
    def __init__(self, comm) -> None:
        self.comm = comm
        self.ref = comm.mpi_comm.Dup()  # MPI's own collectives for reference
        self.p, self.rank = comm.size, comm.rank
        self.cases = self.failures = self.skipped = 0
        self.messages: list[str] = []
        self.seed = 0
        self.digests: list[tuple[str, str]] = []
        # bitwise checks against the emulator, compared at the end (check_emulated): (case seed, rank) ->
        # (label, digest, preview)
        self.outputs: dict[tuple[int, int], tuple[str, str, str]] = {}
        self.emulated: dict[tuple[int, int], tuple[str, str, str]] = {}
        self.references: dict[str, np.ndarray | None] = {}  # MPI's own result, by what it depends on
        self.skips: list[str] = []

    def fail(self, what: str) -> None:
        self.failures += 1
        if len(self.messages) < 20:
            self.messages.append(f"rank {self.rank}: {what}")

    @staticmethod
    def wait(req: MPI.Request) -> None:
        """Poll with sched_yield: MPICH's blocking waits spin, which starves oversubscribed ranks."""
        while not req.Test():
            os.sched_yield()

    # -- reference results -----------------------------------------------------------------------------
    def mpi_reference(self, collective, inputs, dtype, op, root):
        """MPI's own collective on this rank's input (bfloat16 as float32)."""
        x = inputs[self.rank]
        if dtype == BFLOAT16:
            x = x.astype(np.float32)
        p, mop = self.p, REF_OPS.get(op, MPI.SUM)
        if collective == "allreduce":
            out = np.empty_like(x)
            self.wait(self.ref.Iallreduce(x, out, mop))
        elif collective == "reduce":
            out = np.empty_like(x) if self.rank == root else None
            self.wait(self.ref.Ireduce(x, out, mop, root))
        elif collective == "broadcast":
            out = x.copy()
            self.wait(self.ref.Ibcast(out, root))
        elif collective == "reduce_scatter":
            out = np.empty(x.size // p, x.dtype)
            self.wait(self.ref.Ireduce_scatter_block(x, out, mop))
        else:
            out = np.empty(x.size * p, x.dtype)
            self.wait(self.ref.Iallgather(x, out))
        if out is not None and op == "avg":
            out = out.astype(np.float64) / p
        return out

    @staticmethod
    def fingerprint(a) -> tuple[str, str]:
        """(digest of the bytes, a short preview for the failure message) of an output (None: no output)."""
        if a is None:
            return "none", "None"
        flat = np.ascontiguousarray(a).reshape(-1)
        return hashlib.sha1(flat.view(np.uint8).tobytes()).hexdigest(), f"{flat[:6]} ({flat.dtype})"

    def check_emulated(self) -> None:
        """Every rank's output of every schedule case against the emulated one, whichever rank emulated it."""
        emulated = {}
        for part in self.ref.allgather(self.emulated):
            emulated.update(part)
        for key, (label, digest, preview) in self.outputs.items():
            want = emulated.get(key)
            if want is None or want[0] != label:
                self.fail(f"{label}: no emulated output for rank {key[1]}")
            elif want[1] != digest:
                self.fail(f"{label}: differs bitwise from the emulator: got {preview} emulated {want[2]}")

    def compare(self, label, got, reference, dtype, same_everywhere) -> None:
        if reference is not None:
            g = got.reshape(-1)
            if dtype.kind in "iu":
                ok = np.array_equal(g, reference.reshape(-1))
            else:
                ref = reference.reshape(-1).astype(np.float64)
                scale = np.maximum(1.0, np.abs(ref))
                ok = bool(np.all(np.abs(g.astype(np.float64) - ref) <= tolerance(dtype, self.p) * scale))
            if not ok:
                self.fail(f"{label}: differs from MPI's own collective: got {g[:6]} MPI {reference.reshape(-1)[:6]}")
        if same_everywhere:  # checked for all cases at once in check_same_everywhere()
            self.digests.append((label, hashlib.sha1(np.ascontiguousarray(got).view(np.uint8).tobytes()).hexdigest()))

    def check_same_everywhere(self) -> None:
        everyone = self.ref.allgather(self.digests)
        for k, (label, digest) in enumerate(self.digests):
            if any(d[k] != (label, digest) for d in everyone):
                self.fail(f"{label}: ranks got different bits")

    # -- one case --------------------------------------------------------------------------------------
    def case(self, collective, algorithm, dtype, op, n, *, variant="new", root=None, params=None,
             async_batch: int = 0) -> None:
        params = params or {}
        self.seed += 1
        seed, p, r = self.seed, self.p, self.rank
        label = f"{collective}/{algorithm}{params or ''}/{dtype_name(dtype)}/{op}/n={n}/{variant}" + \
                (f"/root={root}" if root is not None else "")
        # the inputs depend on what MPI's reference depends on, not on the algorithm: one reference call serves
        # every algorithm's case (each MPI call costs milliseconds when ranks share cores)
        ref_key = f"{collective}/{dtype_name(dtype)}/{op}/n={n}/root={root}"
        inputs = [make_input(zlib.crc32(ref_key.encode()), q, n, dtype, op) for q in range(p)]
        x = inputs[r].copy()
        kwargs = dict(params)
        if collective in ("allreduce", "reduce_scatter", "reduce"):
            kwargs["op"] = op
        if collective in ("broadcast", "reduce"):
            kwargs["root"] = root
        call = getattr(self.comm, collective)
        out = None
        if variant == "out" and collective != "broadcast":
            size = {"reduce_scatter": n // p, "allgather": n * p}.get(collective, n)
            out = np.full(size, 7, dtype)
            kwargs["out"] = out
        elif variant == "inplace" and collective in ("allreduce", "reduce"):
            kwargs["out"] = x
        try:
            if async_batch:
                handles = [call(x.copy() if collective != "broadcast" else x.copy(), algorithm=algorithm,
                                async_op=True, **{k: v for k, v in kwargs.items() if k != "out"})
                           for _ in range(async_batch)]
                results = [h.wait() for h in reversed(handles)][::-1]
                got = results[0]
                if any((res is None) != (got is None) or (got is not None and
                       res.reshape(-1).view(np.uint8).tobytes() != got.reshape(-1).view(np.uint8).tobytes())
                       for res in results):
                    self.fail(f"{label}: async handles of identical calls gave different results")
            else:
                got = call(x, algorithm=algorithm, **kwargs)
        except ValueError as exc:  # a builder refusing this shape or topology: the same on every rank
            self.skipped += 1
            if len(self.skips) < 5:
                self.skips.append(f"{label}: {exc}")
            return
        self.cases += 1
        choice = self.comm.last_choice
        if variant == "out" and collective != "broadcast" and (collective != "reduce" or r == root) \
                and got is not out:
            self.fail(f"{label}: out= was given but a different array was returned")
        if variant == "inplace" and collective in ("allreduce",) and got is not x:
            self.fail(f"{label}: out=x (in place) but a different array was returned")
        if collective != "broadcast" and variant != "inplace" and \
                x.view(np.uint8).tobytes() != inputs[r].view(np.uint8).tobytes():
            self.fail(f"{label}: the input was modified")
        if choice.algorithm not in ("native", "copy"):
            self.outputs[(seed, r)] = (label, *self.fingerprint(got))
            if seed % p == r:  # this rank emulates the case for every rank
                schedule = self.comm.last_schedule  # what the call ran (in-network builders also take dtype and op)
                outs = emulate(schedule, inputs, op if collective != "allgather" and collective != "broadcast"
                               else "sum")
                for q, e in enumerate(outs):
                    self.emulated[(seed, q)] = (label, *self.fingerprint(e))
        if ref_key not in self.references:
            self.references[ref_key] = self.mpi_reference(collective, inputs, dtype, op, root)
        reference = self.references[ref_key]
        if collective == "reduce" and r != root:
            if got is not None:
                self.fail(f"{label}: non-root got {type(got).__name__}, expected None")
            return
        same = collective in ("allreduce", "allgather", "broadcast")
        self.compare(label, got, reference, dtype, same)


def run(args) -> int:
    comm = init(ranks_per_domain=args.ranks_per_domain)
    chk = Checker(comm)
    p = comm.size
    t0 = time.perf_counter()
    counts = args.counts
    dtypes = [d for d in DTYPES if args.dtypes is None or dtype_name(d) in args.dtypes]
    for collective in ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce"):
        algos = algorithms.names(collective) + ["native", "auto"]
        if args.only:
            algos = [a for a in algos if a in args.only]
        for algorithm in algos:
            for dtype in dtypes:
                # MPI has no bfloat16 type: its reductions refuse it, its data movements carry it as bytes
                if algorithm == "native" and dtype == BFLOAT16 and collective not in ("allgather", "broadcast"):
                    try:
                        getattr(comm, collective)(np.zeros(4 * p, dtype), algorithm="native")
                        chk.fail(f"{collective}/native/bfloat16 did not raise")
                    except TypeError:
                        chk.cases += 1
                    continue
                ops = ["sum"]
                if collective != "allgather" and collective != "broadcast":
                    if dtype in (np.dtype(np.int32), np.dtype(np.float32)):
                        ops = ["sum", "prod", "min", "max"]
                    if dtype.kind == "f" or dtype == BFLOAT16:
                        ops.append("avg")
                for k, op in enumerate(ops):
                    for j, n in enumerate(counts):
                        if collective == "reduce_scatter":
                            n *= p
                        variant = ("new", "out", "inplace")[(j + k) % 3]
                        root = ((j + k) % p) if collective in ("broadcast", "reduce") else None
                        chk.case(collective, algorithm, dtype, op, n, variant=variant, root=root)
            # async handles: several in flight, waited in reverse order
            dt = np.dtype(np.float32)
            chk.case(collective, algorithm, dt, "sum", 13 * p, root=0 if collective in ("broadcast", "reduce")
                     else None, async_batch=3)
    # pipelined variants
    for name in ("ring", "binomial"):
        for collective in algorithms.info(name).collectives:
            chk.case(collective, name, np.dtype(np.float32), "sum", 97 * p, params={"chunks": 3},
                     root=p - 1 if collective in ("broadcast", "reduce") else None)
    # in-network reduction: the star's switch node runs on a daemon (if any) or on rank 0
    comm.reset_stats()
    for dtype in dtypes:
        for op in ("sum", "max"):
            chk.case("allreduce", "star", dtype, op, 33, params={"chunks": 5, "switches": 3})
    star_stats = dict(comm.stats)
    comm.reset_stats()
    n = 1000
    comm.allreduce(np.ones(n, np.float32), algorithm="ring")
    ring_stats = dict(comm.stats)
    comm.reset_stats()
    comm.allreduce(np.ones(n, np.float32), algorithm="star")
    star_one = dict(comm.stats)
    if p > 1 and star_one["bytes_sent"] != 4 * n:
        chk.fail(f"star allreduce: rank sent {star_one['bytes_sent']} bytes, expected D = {4 * n}")
    # a mixed async batch across collectives and algorithms completes in issue order
    x = np.arange(8 * p, dtype=np.float64)
    hs = [comm.allreduce(x, algorithm="ring", async_op=True), comm.allgather(x[:3], async_op=True),
          comm.broadcast(x.copy(), root=p - 1, algorithm="native", async_op=True),
          comm.reduce_scatter(x, algorithm="ring", async_op=True), comm.barrier(async_op=True)]
    while not hs[-1].test():
        pass
    if not all(h.test() for h in hs):
        chk.fail("a later handle completed before an earlier one")
    if not np.array_equal(hs[0].wait(), x * p):
        chk.fail("async allreduce in a mixed batch gave a wrong result")
    # MPI's own collective issued blocking on even ranks and async on odd ranks, or behind another call in flight
    # on some ranks only, still matches across ranks and completes everywhere with the right result
    y = np.arange(5 * p, dtype=np.float32)
    for case in ("async on odd ranks", "a call in flight on odd ranks"):
        if comm.rank % 2 and case.startswith("async"):
            got = comm.allreduce(y, algorithm="native", async_op=True).wait()
        elif comm.rank % 2:
            pending = comm.broadcast(y.copy(), root=0, algorithm="chain", async_op=True)
            got = comm.allreduce(y, algorithm="native")
            pending.wait()
        else:
            if p > 1 and case.startswith("a call"):
                comm.broadcast(y.copy(), root=0, algorithm="chain")
            got = comm.allreduce(y, algorithm="native")
        if not np.array_equal(got, y * p):
            chk.fail(f"native allreduce, {case}: wrong result")
    chk.check_same_everywhere()
    chk.check_emulated()
    failures = comm.mpi_comm.allreduce(chk.failures)
    cases = comm.mpi_comm.allreduce(chk.cases, op=MPI.MAX)
    skipped = comm.mpi_comm.allreduce(chk.skipped, op=MPI.MAX)
    messages = comm.mpi_comm.gather(chk.messages)
    elapsed = time.perf_counter() - t0
    if comm.rank == 0:
        result = {"world_size": p, "daemons": comm.daemons, "cases": cases, "skipped": skipped,
                  "failures": failures, "seconds": round(elapsed, 2),
                  "bytes_sent_per_rank": {"ring": ring_stats["bytes_sent"], "star": star_one["bytes_sent"]},
                  "star_switch_bytes_on_rank0": star_stats["switch_bytes_received"],
                  "shared_memory": comm.shared_memory,
                  # messages from this many bytes are read from the sender's memory (0: never; shm/plan.py)
                  "single_copy_min": comm._ctx.arena.single_copy_min if comm.shared_memory else 0,
                  "messages": [m for ms in messages for m in ms][:20], "skips": chk.skips}
        print("RESULT " + json.dumps(result), flush=True)
    comm.close()
    return 1 if failures else 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--counts", type=int, nargs="+", default=[0, 1, 7, 50],
                    help="element counts per case (reduce_scatter: times the world size)")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--dtypes", nargs="+", choices=[dtype_name(d) for d in DTYPES], default=None,
                    help="the dtypes to run (default: all of them)")
    ap.add_argument("--ranks-per-domain", type=int, default=None,
                    help="emulate scale-up domains of this many ranks (hierarchical, SHARP, NVLS schedules)")
    args = ap.parse_args()
    try:
        return run(args)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)
        return 1


if __name__ == "__main__":
    sys.exit(main())
