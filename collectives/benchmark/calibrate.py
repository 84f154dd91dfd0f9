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

The topology is `preset("loopback", ranks=p)` with nvlink_bandwidth = B, nvlink_latency = per-round / 2 and
reduce_bandwidth = {dtype: measured, "default": float32's}; `calibration` in the JSON keeps the raw numbers.
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
    """Median seconds of fn() with every rank running it at the same time (barrier before each)."""
    times = []
    fn()
    for _ in range(reps):
        mpi_comm.Barrier()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return mpi_comm.allreduce(_median(times), op=_max())


def _max():
    from mpi4py import MPI

    return MPI.MAX


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


def transport_round_cost(comm, quick: bool = False) -> float:
    """Seconds per round of a schedule on the transport with (almost) no payload: ring allreduce of p floats."""
    p = comm.size
    if p == 1:
        return 0.0
    x = np.ones(p, np.float32)
    out = np.empty_like(x)
    ctl = comm.mpi_comm
    t = _concurrent(ctl, lambda: comm.allreduce(x, out=out, algorithm="ring"), 20 if quick else 60)
    return t / (2 * (p - 1))


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
        say("transport round cost ...")
        rnd = transport_round_cost(comm, quick=quick)
    finally:
        mpi_comm.Free()
    return {"ranks": comm.size, "oversubscribed": bool(executor._oversubscribed),
            "pingpong_one_way_s": [[n, t] for n, t in pp], "p2p_latency_s": a, "p2p_bandwidth": B,
            "exchange_s": [[n, t] for n, t in ex], "exchange_latency_s": ex_a, "exchange_bandwidth": ex_B,
            "memcpy_bandwidth": copy_bw, "reduce_bandwidth": red, "reduce_curve": red_curve, "transport_round_s": rnd}


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
            "memcpy_bandwidth": numbers["memcpy_bandwidth"]}


def _interp(points: list, x: float) -> float:
    """Log-log interpolation in [[x, y], ...], clamped to the end points."""
    xs = np.log([max(p[0], 1) for p in points])
    ys = np.log([p[1] for p in points])
    return float(np.exp(np.interp(np.log(max(x, 1)), xs, ys)))


def sized_overrides(calibration: dict, nbytes: int, dtype: str) -> dict:
    """Topology parameters for an operation of `nbytes` (full buffer) from the calibrated curves: the exchange
    bandwidth and the reduction throughput measured at the same size. On this kind of host both fall by 2-3x
    once the buffers leave the last-level cache; one bandwidth per link cannot say that, so `bench --predict`
    re-parameterises the topology per size (the simulator itself is unchanged)."""
    a = calibration.get("exchange_latency_s", 0.0)
    pts = [[n, n / max(t - a, 0.5 * t)] for n, t in calibration["exchange_s"] if t > 0]
    out = {"nvlink_bandwidth": _interp(pts, nbytes)}
    curves = calibration.get("reduce_curve", {})
    if curves:
        red = {d: _interp(c, nbytes) for d, c in curves.items()}
        red["default"] = red.get(dtype, red.get("float32", min(red.values())))
        out["reduce_bandwidth"] = red
    return out
