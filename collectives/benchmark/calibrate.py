"""`collectives calibrate`: measure this host as the library's collectives see it, and write a loopback topology.

Every measurement runs on all ranks at once, as a collective's rounds do (with 4 ranks on 2 cores the ranks
share cores in calibration exactly as they will in `collectives bench`):

1. point-to-point: ping-pong between rank pairs (0-1, 2-3, ...) over sizes, one-way time = round trip / 2,
   fitted to a + n/B (least squares on relative error); B becomes the topology's link bandwidth;
2. memcpy bandwidth (np.copyto of large arrays) on every rank: reported (shared memory copy speed);
3. the kernels' reduction throughput per dtype: `reduce_into(a, [a, b])` on large arrays, bytes of one input
   per second (what the simulator charges a rank per received byte it reduces);
4. the transport's per-round software cost: a ring allreduce of p elements (2(p-1) rounds, no payload to
   speak of) timed per call; per round = time / (2(p-1)). This is what a round of any schedule costs on
   top of its bytes (posting requests, polling, landing, Python), and it is recorded as the message latency:
   a loopback message crosses two hops (rank -> shared-memory "switch" -> rank), so the hop latency
   (`nvlink_latency`) is half of it.

5. the shared-memory executor's data movement at each operation size D (`window_exchange`, timed as the
   executor runs it: the C plan runner's instructions in one C call per pass, or the Python executor's numpy
   copies and `reduce_into` where the runner does not serve): with the footprint of an in-place allreduce (a
   private buffer and an MPI-3 shared window of D bytes per rank) and pieces of m = D/p bytes, the time per
   piece of the executor's two kinds of round, every rank at once: a *copy round* (mirror a piece, private ->
   own window, publish a counter, wait for the left neighbour's, land the piece it mirrored, its window ->
   private) and a *reduce round* (the same with private += its window, the kernels). Round k mirrors what round
   k - 1 received, as a call forwards what it received, so a mirror reads lines just written and a land fetches
   lines the neighbour has just written (from its cache, or across the socket's fabric when the two cores share
   no L3); the waits interleave ranks that share a core as a call does (without them a rank ran its whole pass
   before or after its core-mate's, and one launch priced 4 MiB at p = 4 on 2 cores at a quarter of the
   executor's time, another at 1.2x, depending on which ranks shared a core). The same pass without data gives
   the rounds' synchronisation, left out of the curves: the model charges a round's synchronisation as its
   latency, the per-round cost of item 6 (with 4 ranks on 2 cores 0.3-1.7 us there, against 3.2-3.8 us in the
   empty pass, where every wait costs a context switch; at p = 2 both are under 1 us).
   With more ranks than cores a pass is timed from the first rank's start to the last rank's end (one clock on
   one host), which shows ranks that share a core running one after the other, less the span of an empty phase
   (how unevenly ranks leave a barrier: 10-25 us with 4 ranks on 2 cores, as much as a 64 KiB pass, and paid
   once per call, in its fixed cost). Each size is timed as `collectives bench` times a call: the median of at
   least 20 passes (60 at 64 KiB, 8 over 16 MiB, fewer with --quick) after 5 untimed ones;
6. the transport's fixed costs with no payload: ring allreduce (2(p-1) rounds) and one_shot allreduce (1 round)
   of tiny arrays, through the same path, give the cost per round (difference / (2p-3)) and per call (the
   ring's time less its rounds);
7. the host's cores (the union of its ranks' CPU affinities) and ranks per host: with more ranks than cores,
   `bench --predict` prices schedules that idle ranks by processor time as well (benchmark/cores.py);
8. with ranks bound so that rank r and rank r - s share a core while neighbours do not (`mpiexec -bind-to core`
   with more ranks than cores: s = cores), the same window rounds with the peer s places to the left, a core-mate
   (`window_mates_s`, `core_mate_shift`): between core-mates a landing reads lines the core's own caches hold,
   across cores they cross the host's fabric, 3-4x a local copy at 1-4 MiB when a VM's vCPUs sit on different
   chiplets (benchmark/cores.py prices each transfer by which it is);
9. how far apart two of rank 0's host's cores are (`core_to_core_s`, one-way seconds of a cache line, before
   and after the window curves: benchmark/host_state.py): the state of the host the curves describe, which a
   VM's hypervisor may change while a job runs; `bench --predict` measures it again per size.

The topology is `preset("loopback", ranks=p)` with nvlink_bandwidth = B, nvlink_latency = per-round / 2 and
reduce_bandwidth = {dtype: measured, "default": float32's}; `calibration` in the JSON keeps the raw numbers.
`bench --predict` re-parameterises it per size from the window curves (`sized_overrides`): a schedule's
receive costs a copy round (B = m / copy round), a receive-reduce a reduce round (the reduce rate is set so
that transfer + reduce = reduce round); and it adds the per-call cost to the simulated time. Calibrations
written before the round curves (separate mirror / land / reduce phases) are read as mirror + land and
mirror + reduce.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from .host_state import CoreDistance

PINGPONG_SIZES = [8, 64, 512, 4 << 10, 32 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20]
EXCHANGE_SIZES = [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int64", "int8")


def _median(values) -> float:
    return float(statistics.median(list(values)))


def _reps(nbytes: int, quick: bool) -> int:
    base = 60 if nbytes <= 64 << 10 else 20 if nbytes <= 1 << 20 else 8
    return max(4, base // 3) if quick else base


def pingpong(mpi_comm, sizes=PINGPONG_SIZES, quick: bool = False) -> list[tuple[int, float]]:
    """[(bytes, one-way seconds)]: median round trip / 2 of each pair, averaged over pairs (all pairs at once)."""
    from mpi4py import MPI

    rank, p = mpi_comm.Get_rank(), mpi_comm.Get_size()
    partner = rank ^ 1 if (rank ^ 1) < p else None
    out = []
    for n in sizes:
        buf = np.zeros(max(n, 1), np.uint8)
        reps = _reps(n, quick)
        trips = []
        mpi_comm.Barrier()
        if partner is not None:
            for k in range(reps + 2):
                t0 = time.perf_counter()
                if rank % 2 == 0:
                    mpi_comm.Send([buf[:n], MPI.BYTE], partner, 7)
                    mpi_comm.Recv([buf[:n], MPI.BYTE], partner, 7)
                else:
                    mpi_comm.Recv([buf[:n], MPI.BYTE], partner, 7)
                    mpi_comm.Send([buf[:n], MPI.BYTE], partner, 7)
                if k >= 2:  # two warm-up trips
                    trips.append(time.perf_counter() - t0)
        mine = _median(trips) / 2 if trips else 0.0
        total = mpi_comm.allreduce(mine, MPI.SUM)
        pairs = mpi_comm.allreduce(1 if trips else 0, MPI.SUM)
        out.append((n, total / max(pairs, 1)))
    return out


def exchange(mpi_comm, sizes=EXCHANGE_SIZES, quick: bool = False) -> list[tuple[int, float]]:
    """[(bytes, seconds)]: every rank sends n bytes to its pair partner and receives n from it at the same time
    (Sendrecv, distinct send and receive buffers, as in a collective's round); median per exchange, max over
    ranks."""
    from mpi4py import MPI

    rank, p = mpi_comm.Get_rank(), mpi_comm.Get_size()
    partner = rank ^ 1 if (rank ^ 1) < p else None
    out = []
    for n in sizes:
        send = np.ones(n, np.uint8)
        recv = np.ones(n, np.uint8)
        times = []
        for k in range(_reps(n, quick) + 2):
            mpi_comm.Barrier()
            t0 = time.perf_counter()
            if partner is not None:
                mpi_comm.Sendrecv([send, MPI.BYTE], partner, 9, [recv, MPI.BYTE], partner, 9)
            if k >= 2:
                times.append(time.perf_counter() - t0)
        out.append((n, mpi_comm.allreduce(_median(times), MPI.MAX)))
    return out


def fit_latency_bandwidth(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(a seconds, B bytes/s) minimising the relative error of a + n/B over the points."""
    n = np.array([p[0] for p in points], float)
    t = np.array([p[1] for p in points], float)
    w = 1 / np.maximum(t, 1e-12)
    A = np.stack([np.ones_like(n), n], axis=1) * w[:, None]
    (a, x), *_ = np.linalg.lstsq(A, t * w, rcond=None)
    if x <= 0:  # degenerate (noise): bandwidth from the largest size alone
        x = t[-1] / n[-1]
    if a < 0:
        a = 0.0
        x = float(np.sum(n * t * w * w) / np.sum(n * n * w * w))
    return float(a), float(1 / x)


def _concurrent(mpi_comm, fn, reps: int) -> float:
    """Median over reps of the slowest rank's seconds for fn(), every rank running it at once (barrier before
    each): the statistic `collectives bench` reports (per-iteration maximum over ranks, then the median), so a
    fixed cost measured here carries the same barrier-exit skew as the calls it prices."""
    from mpi4py import MPI

    times = np.empty(reps)
    fn()
    for k in range(reps):
        mpi_comm.Barrier()
        t0 = time.perf_counter()
        fn()
        times[k] = time.perf_counter() - t0
    slowest = np.empty_like(times)
    mpi_comm.Allreduce(times, slowest, MPI.MAX)
    return _median(slowest)


def memcpy_bandwidth(mpi_comm, nbytes: int = 64 << 20, quick: bool = False) -> float:
    a = np.ones(nbytes, np.uint8)
    b = np.empty_like(a)
    t = _concurrent(mpi_comm, lambda: np.copyto(b, a), 4 if quick else 10)
    return nbytes / t


REDUCE_SIZES = (1 << 20, 64 << 20)  # in cache (L2/L3) and well beyond it


def reduce_curve(mpi_comm, dtypes=DTYPES, sizes=REDUCE_SIZES, quick: bool = False) -> dict[str, list]:
    """{dtype: [[bytes per input, bytes/s], ...]} over `sizes`."""
    per_size = [reduce_throughput(mpi_comm, dtypes, n, quick) for n in sizes]
    return {d: [[n, r[d]] for n, r in zip(sizes, per_size, strict=True)] for d in dtypes}


def reduce_throughput(mpi_comm, dtypes=DTYPES, nbytes: int = 64 << 20, quick: bool = False) -> dict[str, float]:
    """Bytes of one input reduced per second by reduce_into(a, [a, b], "sum"), every rank at once."""
    from ..kernels import reduce_into
    from ..kernels._dtypes import SUPPORTED_DTYPES, dtype_name

    by_name = {dtype_name(d): d for d in SUPPORTED_DTYPES}
    out = {}
    for name in dtypes:
        dt = by_name[name]
        count = nbytes // dt.itemsize
        a = np.ones(count, dt)
        b = np.ones(count, dt)
        t = _concurrent(mpi_comm, lambda a=a, b=b: reduce_into(a, [a, b], "min"), 3 if quick else 8)
        out[name] = count * dt.itemsize / t
    return out


WINDOW_SIZES = [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
# The window rounds are timed as `collectives bench` times a call: after 5 untimed passes (its -w default), and up
# to 16 MiB over 20 passes (its -n default), so a price and the measurement it predicts see the same warm-up (at
# 4 MiB, this VM's L3 knee, a size's first ~10 passes ran up to 10% slower than later ones; docs/benchmarks.md).
WINDOW_WARMUP = 5


def _window_reps(nbytes: int, quick: bool) -> int:
    """Timed passes of a window round: as many as 1 MiB gets (20) up to 16 MiB, then _reps' 8."""
    return max(3, _reps(min(nbytes, 1 << 20) if nbytes <= 16 << 20 else nbytes, quick))


def _phase(mpi_comm, fn, reps: int, span: bool = True, skew: float = 0.0, warmup: int = 1) -> float:
    """Median over reps of fn() run by every rank at once (after `warmup` untimed runs): with `span`, (last
    rank's end - first rank's start) less `skew` (the span of an empty phase, `barrier_skew`), but never less
    than the slowest rank's own time: that shows ranks that share a core running one after the other; without,
    the slowest rank's own time, which leaves out how unevenly the ranks leave the barrier (a call pays that
    skew once, in its fixed cost, not once per piece)."""
    from mpi4py import MPI

    for _ in range(warmup):
        fn()
    spans = []
    for _ in range(reps):
        mpi_comm.Barrier()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        own = mpi_comm.allreduce(t1 - t0, op=MPI.MAX)
        if span:
            whole = mpi_comm.allreduce(t1, op=MPI.MAX) - mpi_comm.allreduce(t0, op=MPI.MIN)
            spans.append(max(whole - skew, own))
        else:
            spans.append(own)
        mpi_comm.Barrier()  # nobody starts the next pass (overwriting its window) while a peer still reads it
    return _median(spans)


def barrier_skew(mpi_comm, reps: int = 60) -> float:
    """Median span of an empty phase (`_phase` of a no-op, span timing): how far apart the ranks leave a
    barrier and reach the end clock when they have nothing to do. With 4 ranks on 2 cores it is ~10-25 us, as
    much as the data of a 64 KiB phase; a call pays it once (in its measured fixed cost), so the per-piece
    times leave it out."""
    return _phase(mpi_comm, lambda: None, reps, span=True)


def window_exchange(mpi_comm, sizes=WINDOW_SIZES, quick: bool = False,
                    peer_shift: int = 1) -> tuple[dict[str, list], float]:
    """({"copy_round"|"reduce_round": [[D, seconds per piece], ...]}, sync seconds per round): the shared-memory
    executor's two kinds of round over pieces of D/p bytes of a D-byte buffer (float32), every rank at once, each
    rank's peer its left neighbour on the host, less the rounds' synchronisation (the same pass without data,
    returned second); see the module docstring, item 5. `peer_shift`: the peer is the rank that many places to
    the left (bench/core_pairs.py times peers that share a core this way)."""
    from mpi4py import MPI

    from ..kernels import reduce_into
    from ..transport import executor, shm_program

    # time what the executor will run: the C plan runner's instructions when it serves float32 sums here
    kernel = shm_program.kernel_for(np.dtype(np.float32), "sum", 0)
    node = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED)
    p, here, on_host = mpi_comm.Get_size(), node.Get_rank(), node.Get_size()
    oversubscribed = bool(executor._oversubscribed)  # ranks share cores: time the span (see _phase)
    skew = barrier_skew(mpi_comm, 20 if quick else 60) if oversubscribed else 0.0
    win = MPI.Win.Allocate_shared(max(sizes), 1, comm=node)
    flags = MPI.Win.Allocate_shared(64, 8, comm=node)  # a counter per rank on its own cache line, as the runner
    try:
        left = (here - peer_shift) % on_host  # the peer on this host (windows are per host) whose window a rank reads
        mine, _ = win.Shared_query(here)
        theirs, _ = win.Shared_query(left)
        counters = [np.frombuffer(flags.Shared_query(q)[0], np.int64, 1) for q in range(on_host)]
        counters[here][0] = 0
        node.Barrier()

        def rounds_of(pieces):
            """(sent, received) per round: round k mirrors piece here - k and receives piece left - k from the
            left neighbour (which mirrored it in that round); with the neighbour at here - 1 that is the piece
            mirrored next: what a rank receives in one round it sends in the next (a ring's partial sums,
            Rabenseifner's halves, a tree's sums on their way up), so a mirror reads lines the step before it has
            just written, as in a call."""
            return [(pieces[(here - k) % p], pieces[(left - k) % p]) for k in range(p)]

        def program(buffers, rounds, reduce: bool):
            """The runner's instructions for one pass: per round mirror, publish, wait for the left neighbour's
            publish (yielding the CPU as the executor does when ranks share cores), then land or reduce."""
            steps = []
            for k, (s, t) in enumerate(rounds):
                steps += [("copy", 1, 0, s.start, s.stop), ("publish", k + 1), ("wait", left, k + 1),
                          ("reduce", 0, [0, 2], t.start, t.stop) if reduce else ("copy", 0, 2, t.start, t.stop)]
            line = shm_program.StraightLine(steps, buffers, 4, kernel, counters, here)
            return lambda: line(1024, int(oversubscribed))

        out: dict[str, list] = {"copy_round": [], "reduce_round": []}
        sync = 0.0
        if kernel is not None:
            empty = np.zeros(p, np.float32)
            nothing = [slice(0, 0)] * p
            sync = _phase(mpi_comm, program([empty, empty, empty], rounds_of(nothing), False), 60 if not quick
                          else 20, span=oversubscribed, skew=skew) / p
        for D in sizes:
            n = D // 4
            m = n // p
            x = np.ones(n, np.float32)
            own = np.frombuffer(mine, np.float32, n)
            peer = np.frombuffer(theirs, np.float32, n)
            rounds = rounds_of([slice(i * m, (i + 1) * m) for i in range(p)])

            if kernel is not None:  # the plan runner's own instructions, one C call per pass
                copy_round = program([x, own, peer], rounds, False)
                reduce_round = program([x, own, peer], rounds, True)
            else:  # the Python executor's operations (without the rounds' synchronisation)
                def copy_round(x=x, own=own, peer=peer, rounds=rounds):
                    for s, t in rounds:
                        np.copyto(own[s], x[s])
                        np.copyto(x[t], peer[t])

                def reduce_round(x=x, own=own, peer=peer, rounds=rounds):
                    for s, t in rounds:
                        np.copyto(own[s], x[s])
                        reduce_into(x[t], [x[t], peer[t]], "sum")

            reps = _window_reps(D, quick)
            for name, fn in (("copy_round", copy_round), ("reduce_round", reduce_round)):
                whole = _phase(mpi_comm, fn, reps, span=oversubscribed, skew=skew, warmup=WINDOW_WARMUP) / p
                # the data's share; the synchronisation is the per-round latency (round_s) in the model
                out[name].append([D, max(whole - sync, 0.1 * whole)])
        return out, sync
    finally:
        node.Barrier()  # no rank frees the windows while a neighbour may still read them
        flags.Free()
        win.Free()
        node.Free()


def core_mate_shift(mpi_comm, host_cpus: list[frozenset]) -> int | None:
    """The distance s at which every rank's host-local neighbour shares its CPUs (ranks r and r - s on one core)
    while its left neighbour does not (so calibrate's rounds, peer one place to the left, cross cores), the same
    on every host; None when ranks are not bound that way (unbound ranks: the OS decides who shares a core).
    With `mpiexec -bind-to core -n 4` on 2 cores ranks r and r + 2 share a core: s = 2. `host_cpus`: this host's
    ranks' CPU sets in rank order (`CoreDistance.host_cpus`). Collective."""
    shifts = mpi_comm.allgather(mate_shift_of(host_cpus))
    return shifts[0] if all(x == shifts[0] for x in shifts) else None


def mate_shift_of(cpus: list[frozenset]) -> int | None:
    """`core_mate_shift` for one host: its ranks' CPU sets in rank order."""
    p = len(cpus)
    if p < 3 or any(cpus[r] & cpus[r - 1] for r in range(p)):
        return None
    return next((s for s in range(2, p) if all(cpus[r] == cpus[r - s] for r in range(p))), None)


def mate_ratio(calibration: dict, nbytes: int) -> float | None:
    """The copy round between core-mates over the copy round across cores, for an operation of `nbytes` (at most
    1: noise can make the mates' round look dearer), or None when the calibration has no mates' round."""
    mates = (calibration or {}).get("window_mates_s")
    if not mates or "copy_round" not in mates or "copy_round" not in calibration.get("window_s", {}):
        return None
    return min(_interp(mates["copy_round"], nbytes) / _interp(calibration["window_s"]["copy_round"], nbytes), 1.0)


def transport_fixed_costs(comm, quick: bool = False) -> dict[str, float]:
    """The transport with no payload to speak of, in seconds: `transport_round_s` (ring allreduce of p floats
    / its 2(p-1) rounds: item 4 of the module docstring), `round_s` and `call_overhead_s` (item 6: the same
    allreduce against one_shot's single round, both through the same path of the communicator, so their
    difference is rounds only)."""
    p = comm.size
    if p == 1:
        return {"transport_round_s": 0.0, "round_s": 0.0, "call_overhead_s": 0.0}
    tiny = np.ones(p, np.float32)
    out = np.empty(p, np.float32)
    ctl = comm.mpi_comm
    reps = 20 if quick else 60
    t_ar = _concurrent(ctl, lambda: comm.allreduce(tiny, out=out, algorithm="ring"), reps)
    t_one = _concurrent(ctl, lambda: comm.allreduce(tiny, out=out, algorithm="one_shot"), reps)
    rounds = 2 * (p - 1)
    per_round = max(t_ar - t_one, 0.0) / (rounds - 1) if rounds > 1 else t_ar / rounds
    return {"transport_round_s": t_ar / rounds, "round_s": per_round,
            "call_overhead_s": max(t_ar - rounds * per_round, 0.0)}


def host_cores(mpi_comm) -> dict[str, int]:
    """{"cores": CPUs the ranks of rank 0's host may run on (the union of their affinities), "ranks_per_host": the
    most ranks on one host}: with more ranks than cores they share cores (benchmark/cores.py)."""
    from mpi4py import MPI

    from ..transport.communicator import host_layout

    ranks, cpus = host_layout(mpi_comm)  # the transport's own reckoning of whether ranks share cores
    return {"cores": int(mpi_comm.bcast(cpus, root=0)), "ranks_per_host": int(mpi_comm.allreduce(ranks, op=MPI.MAX))}


def calibrate(comm, quick: bool = False, log=None) -> dict:
    """Run every measurement (collective over `comm`'s ranks); returns the raw numbers (same on every rank)."""
    from ..transport import executor

    say = log or (lambda msg: None)
    mpi_comm = comm.mpi_comm.Dup()
    try:
        say("point-to-point ping-pong ...")
        pp = pingpong(mpi_comm, quick=quick)
        a, B = fit_latency_bandwidth([(n, t) for n, t in pp if n >= 512] or pp)
        say("exchange ...")
        ex = exchange(mpi_comm, quick=quick)
        ex_a, ex_B = fit_latency_bandwidth(ex)
        say("memcpy ...")
        copy_bw = memcpy_bandwidth(mpi_comm, quick=quick)
        say("reduction kernels ...")
        red_curve = reduce_curve(mpi_comm, quick=quick)
        red = {d: float(np.exp(np.mean(np.log([bw for _, bw in pts])))) for d, pts in red_curve.items()}
        say("transport round and call costs ...")
        fixed = transport_fixed_costs(comm, quick=quick)
        say("shared-memory windows: copy and reduce rounds ...")
        # the host state the window curves carry: how far apart the cores are, before and after them
        distance = CoreDistance(mpi_comm)
        core_to_core = [distance.measure()]
        window, sync_round = window_exchange(mpi_comm, quick=quick)
        mates = core_mate_shift(mpi_comm, distance.host_cpus)
        mate_window = None
        if mates is not None:
            say("shared-memory windows: the same rounds between ranks that share a core ...")
            mate_window, _ = window_exchange(mpi_comm, quick=quick, peer_shift=mates)
        core_to_core.append(distance.measure())
        distance.close()  # not on an error: freeing its window waits for every rank, and one has failed
    finally:
        mpi_comm.Free()
    return {"ranks": comm.size, "oversubscribed": bool(executor._oversubscribed), "comm_check": comm.check,
            **host_cores(comm.mpi_comm),
            "pingpong_one_way_s": [[n, t] for n, t in pp], "p2p_latency_s": a, "p2p_bandwidth": B,
            "exchange_s": [[n, t] for n, t in ex], "exchange_latency_s": ex_a, "exchange_bandwidth": ex_B,
            "memcpy_bandwidth": copy_bw, "reduce_bandwidth": red, "reduce_curve": red_curve, "window_s": window,
            "sync_round_s": sync_round,
            **({"core_to_core_s": core_to_core} if None not in core_to_core else {}),
            **({"core_mate_shift": mates, "window_mates_s": mate_window} if mate_window is not None else {}),
            **fixed}


def topology_from(numbers: dict):
    """The loopback topology (a Cluster) carrying the calibrated numbers."""
    from ..topology import preset

    red = dict(numbers["reduce_bandwidth"])
    red["default"] = red.get("float32", min(red.values()))
    hop = max(numbers["transport_round_s"], numbers["exchange_latency_s"]) / 2
    return preset("loopback", ranks=numbers["ranks"], nvlink_bandwidth=numbers["exchange_bandwidth"],
                  nvlink_latency=hop, reduce_bandwidth=red,
                  description=f"this host, calibrated with {numbers['ranks']} ranks"
                              f"{' (oversubscribed)' if numbers['oversubscribed'] else ''}: "
                              f"exchange {numbers['exchange_latency_s'] * 1e6:.1f} us + n / "
                              f"{numbers['exchange_bandwidth'] / 1e9:.2f} GB/s, transport round "
                              f"{numbers['transport_round_s'] * 1e6:.1f} us")


def calibration_entry(numbers: dict) -> dict:
    """What the saved topology keeps under "calibration" (ignored by topology.load, read by `bench --predict`)."""
    return {"ranks": numbers["ranks"], "oversubscribed": numbers["oversubscribed"],
            "transport_round_s": numbers["transport_round_s"], "exchange_latency_s": numbers["exchange_latency_s"],
            "exchange_s": numbers["exchange_s"], "reduce_curve": numbers["reduce_curve"],
            "p2p_latency_s": numbers["p2p_latency_s"], "p2p_bandwidth": numbers["p2p_bandwidth"],
            "memcpy_bandwidth": numbers["memcpy_bandwidth"], "window_s": numbers["window_s"],
            "sync_round_s": numbers.get("sync_round_s", 0.0),
            "round_s": numbers["round_s"], "call_overhead_s": numbers["call_overhead_s"],
            **{k: numbers[k] for k in ("cores", "ranks_per_host", "comm_check", "core_to_core_s", "core_mate_shift",
                                       "window_mates_s") if k in numbers}}


def _interp(points: list, x: float) -> float:
    """Log-log interpolation in [[x, y], ...], clamped to the end points."""
    xs = np.log([max(p[0], 1) for p in points])
    ys = np.log([p[1] for p in points])
    return float(np.exp(np.interp(np.log(max(x, 1)), xs, ys)))


def window_overrides(calibration: dict, nbytes: int, dtype: str) -> dict:
    """Topology parameters for an operation of `nbytes` from the shared-memory window curves (see the module
    docstring): link bandwidth m / copy round, reduce rate m / (reduce round - copy round) for float32 (other
    dtypes scaled by the kernels' measured throughput ratio), hop latency half the per-round cost."""
    w = calibration["window_s"]
    p = calibration["ranks"]
    m = nbytes / p
    if "copy_round" in w:
        copy_round, reduce_round = (_interp(w[k], nbytes) for k in ("copy_round", "reduce_round"))
    else:  # a calibration from before the round curves: separate mirror, land and reduce phases
        mirror, land, reduce_alone = (_interp(w[k], nbytes) for k in ("mirror", "land", "reduce"))
        copy_round, reduce_round = mirror + land, mirror + reduce_alone
    bandwidth = m / max(copy_round, 1e-12)
    # the reduce's cost beyond the land it replaces (>= 5% of the round: noise can make it look free)
    extra = max(reduce_round - copy_round, 0.05 * reduce_round)
    curves = calibration.get("reduce_curve", {})
    base = _interp(curves["float32"], nbytes) if "float32" in curves else None
    rates = {}
    for name, c in curves.items():
        rates[name] = m / (extra * (base / _interp(c, nbytes) if base else 1.0))
    rates["default"] = rates.get(dtype, m / extra)
    return {"nvlink_bandwidth": bandwidth, "reduce_bandwidth": rates,
            "nvlink_latency": calibration.get("round_s", 0.0) / 2 or 1e-9}


def sized_overrides(calibration: dict, nbytes: int, dtype: str) -> dict:
    """Topology parameters for an operation of `nbytes` (full buffer) from the calibrated curves: the exchange
    bandwidth and the reduction throughput measured at the same size. On this kind of host both fall by 2-3x
    once the buffers leave the last-level cache; one bandwidth per link cannot say that, so `bench --predict`
    re-parameterises the topology per size (the simulator itself is unchanged). Calibrations with the
    shared-memory window curves (`window_s`) use those (`window_overrides`); older ones the MPI exchange."""
    if "window_s" in calibration and calibration.get("ranks", 1) > 1:
        return window_overrides(calibration, nbytes, dtype)
    a = calibration.get("exchange_latency_s", 0.0)
    pts = [[n, n / max(t - a, 0.5 * t)] for n, t in calibration["exchange_s"] if t > 0]
    out = {"nvlink_bandwidth": _interp(pts, nbytes)}
    curves = calibration.get("reduce_curve", {})
    if curves:
        red = {d: _interp(c, nbytes) for d, c in curves.items()}
        red["default"] = red.get(dtype, red.get("float32", min(red.values())))
        out["reduce_bandwidth"] = red
    return out
