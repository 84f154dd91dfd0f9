"""`collectives calibrate`: measure this host as the library's collectives see it, and write a loopback topology.

Every measurement runs on all ranks at once, as a collective's rounds do (ranks that share cores in a job share
them here too):

1. point-to-point: ping-pong between rank pairs (0-1, 2-3, ...) over sizes, one-way time = round trip / 2,
   fitted to a + n/B (least squares on relative error): the message path between hosts;
2. exchange: every rank sends and receives n bytes at once (Sendrecv), fitted the same way;
3. memcpy bandwidth (np.copyto of large arrays) on every rank: reported;
4. the kernels' reduction throughput per dtype and size: `reduce_into(a, [a, b])`, bytes of one input per
   second (what the simulator charges a rank per received byte it reduces);
5. the transport's fixed costs with no payload: a ring allreduce (2(p-1) rounds) and a one_shot allreduce
   (1 round) of p floats through the transport give the cost per round (`round_s`: their difference over 2p-3)
   and per call (`call_overhead_s`: the ring's time less its rounds); `transport_round_s` is the ring's time
   per round;
6. the transport's copy and reduce rounds at each operation size D (`window_rounds`): a ring allgather and a
   ring reduce_scatter of D bytes through the transport (over shared memory, the plan runner), less the fixed
   costs, per round: what a round of any schedule costs per piece of D/p bytes.

The topology is `preset("loopback", ranks=p)` with nvlink_bandwidth = the exchange's B, nvlink_latency = the
per-round cost / 2 and reduce_bandwidth = {dtype: measured, "default": float32's}; `calibration` in the JSON
keeps the raw numbers. `bench --predict` re-parameterises it per size from the round curves (`sized_overrides`):
a receive costs a copy round (B = m / copy round), a receive-reduce a reduce round (the reduce rate is set so
that transfer + reduce = reduce round); and it adds the per-call cost to the simulated time.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

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
    from ..transport.mpi_library import MPI

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
    from ..transport.mpi_library import MPI

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
    from ..transport.mpi_library import MPI

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
# Timed as `collectives bench` times a call: after 5 untimed calls (its -w default), the median of as many timed
# calls as its -n default (20) up to 16 MiB, fewer above, so a price and the measurement it predicts see the same
# warm-up.
WINDOW_WARMUP = 5


def _window_reps(nbytes: int, quick: bool) -> int:
    """Timed calls of a window round: as many as 1 MiB gets (20) up to 16 MiB, then _reps' 8."""
    return max(3, _reps(min(nbytes, 1 << 20) if nbytes <= 16 << 20 else nbytes, quick))


def window_rounds(comm, fixed: dict[str, float], sizes=WINDOW_SIZES, quick: bool = False) -> dict[str, list]:
    """{"copy_round"|"reduce_round": [[D, seconds per round], ...]}: the transport's two kinds of round over
    pieces of D/p bytes of a D-byte float32 buffer, timed through the transport itself (the executor a call of
    the library takes: over shared memory, the plan runner). A ring allgather of D bytes is p - 1 copy rounds
    (every rank stores the piece its left neighbour held), a ring reduce_scatter of D bytes p - 1 reduce rounds
    (every rank reduces that piece into its own); a round's share is the call's time less the transport's fixed
    costs (`fixed`: per call, and per round for the rounds' synchronisation, which the model charges as latency),
    over p - 1."""
    p = comm.size
    out: dict[str, list] = {"copy_round": [], "reduce_round": []}
    if p == 1:
        return out
    ctl = comm.mpi_comm
    for D in sizes:
        n = max(p, D // 4 // p * p)
        x = np.ones(n, np.float32)
        gathered = np.empty(n, np.float32)
        block = np.empty(n // p, np.float32)
        piece = x[:n // p]
        calls = (("copy_round", lambda piece=piece, gathered=gathered: comm.allgather(piece, out=gathered,
                                                                                       algorithm="ring")),
                 ("reduce_round", lambda x=x, block=block: comm.reduce_scatter(x, out=block, algorithm="ring")))
        for name, fn in calls:
            for _ in range(WINDOW_WARMUP - 1):
                fn()
            whole = _concurrent(ctl, fn, _window_reps(D, quick))
            rounds = whole - fixed["call_overhead_s"] - (p - 1) * fixed["round_s"]
            out[name].append([D, max(rounds, 0.1 * whole) / (p - 1)])
    return out


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


def calibrate(comm, quick: bool = False, log=None) -> dict:
    """Run every measurement (collective over `comm`'s ranks); returns the raw numbers (same on every rank)."""
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
        say("copy and reduce rounds through the transport ...")
        window = window_rounds(comm, fixed, quick=quick)
    finally:
        mpi_comm.Free()
    host = comm.host
    return {"ranks": comm.size, "oversubscribed": host.oversubscribed, "comm_check": comm.check,
            "cores": host.cores, "ranks_per_host": host.ranks_per_host,
            "pingpong_one_way_s": [[n, t] for n, t in pp], "p2p_latency_s": a, "p2p_bandwidth": B,
            "exchange_s": [[n, t] for n, t in ex], "exchange_latency_s": ex_a, "exchange_bandwidth": ex_B,
            "memcpy_bandwidth": copy_bw, "reduce_bandwidth": red, "reduce_curve": red_curve, "window_s": window,
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
            "round_s": numbers["round_s"], "call_overhead_s": numbers["call_overhead_s"],
            **{k: numbers[k] for k in ("cores", "ranks_per_host", "comm_check") if k in numbers}}


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
