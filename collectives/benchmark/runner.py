"""The measurement loop behind `collectives bench` (run under mpiexec; only rank 0 prints or writes files).

For each size (nccl-tests' sweep) and each algorithm (size-major, so MPI's own collective and the library's
run back to back under the same machine load): with -c, one call on fresh deterministic inputs checked against
the exact reference (data.py); then `warmup` untimed calls and `iters` timed ones, each after a barrier. The
reported time is the mean (or median/min, --stat) over iterations of the slowest rank's time: per iteration the
max over ranks, as nccl-tests reports the time of the collective and not of the fastest rank.
Out-of-place and in-place are measured separately; reduce_scatter and allgather have no in-place form in the
Communicator API (out may not overlap x), so their in-place columns read N/A.
"""

from __future__ import annotations

import csv
import json
import os
import socket
import statistics
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from ..units import human
from . import format as fmt
from .data import Pattern, count_wrong


@dataclass
class AlgoSpec:
    name: str  # "native", "auto" or a registered algorithm
    params: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        if not self.params:
            return self.name
        return self.name + ":" + ":".join(f"{k}={v}" for k, v in self.params.items())


@dataclass
class Options:
    collective: str
    sizes: list[int]
    step: str
    dtype: np.dtype
    op: str
    root: int
    iters: int
    warmup: int
    check: bool
    algorithms: list[AlgoSpec]
    stat: str = "mean"
    predict: str | None = None
    json_path: str | None = None
    csv_path: str | None = None
    osu: bool = False
    osu_full: bool = False
    in_place: bool = True
    max_bytes: int | None = None  # -e as asked (nccl-tests' header shows it, even when the sweep stops below)
    out = sys.stdout


def _stat(values: np.ndarray, how: str) -> float:
    if values.size == 0:
        return float("nan")
    if how == "median":
        return float(statistics.median(values.tolist()))
    if how == "min":
        return float(values.min())
    return float(values.mean())


class Predictor:
    """Simulated times on a saved topology (resized to the job's world size when it is a one-domain cluster)."""

    def __init__(self, path: str, world_size: int, dtype: np.dtype, op: str, root: int) -> None:
        from ..choice import resize as _resize
        from ..topology import load

        self.path = path
        self.world_size = world_size
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"no calibration file {path}: run `mpiexec -n {world_size} collectives calibrate --out {path}` "
                "first, or add --calibrate to this bench to calibrate in the same launch")
        self.topology = _resize(load(path), world_size)
        with open(path) as f:
            self.calibration = json.load(f).get("calibration")  # size-dependent curves (collectives calibrate)
        self._sized: dict = {}
        self.dtype = dtype
        self.op = op
        self.root = root
        self._cache: dict = {}

    def predict(self, collective: str, algorithm: str, params: dict, nbytes: int) -> float | None:
        """Seconds, or None for MPI's own collective / world size 1 (nothing the simulator models)."""
        if algorithm in ("native", "copy") or self.topology.world_size == 1:
            return None
        from ..kernels._dtypes import dtype_name
        from ..simulate import simulate

        key = (collective, algorithm, tuple(sorted(params.items())), nbytes)
        if key not in self._cache:
            root = self.root if collective in fmt.ROOTED else None
            kw = dict(collective=collective, dtype=dtype_name(self.dtype), op="sum" if self.op == "avg" else self.op,
                      root=root, **params)
            topo = self.topology_for(nbytes)
            seconds = float(simulate(algorithm, topo, nbytes, **kw).time)
            self._cache[key] = seconds + self.call_overhead
        return self._cache[key]

    def warnings(self, hosts: list[str]) -> list[str]:
        """Why predictions from this file may not fit this job: another rank count or host, or a calibration
        that found the host too busy (its own verdict, benchmark/host_load.py)."""
        c = self.calibration
        if not c:
            return [f"{self.path} holds a topology but no calibration of this host: predictions use its fixed "
                    "parameters (run `collectives calibrate --out FILE`)"]
        out = []
        ranks = c.get("ranks")
        if ranks is not None and ranks != self.world_size:
            out.append(f"{self.path} was calibrated with {ranks} ranks and this job has {self.world_size}: ranks "
                       "share cores and caches differently, so predictions can be far off; recalibrate with "
                       f"`mpiexec -n {self.world_size} collectives calibrate --out {self.path}`")
        theirs = c.get("hosts")
        if theirs is not None and sorted(set(hosts)) != sorted(theirs):
            out.append(f"{self.path} was calibrated on {', '.join(theirs)} and this job runs on "
                       f"{', '.join(sorted(set(hosts)))}: recalibrate on this host")
        out += [f"{self.path}: calibrate found the host too busy to measure reliably: {w}"
                for w in c.get("quality", {}).get("warnings", [])]
        return out

    @property
    def call_overhead(self) -> float:
        """The transport's measured fixed cost per call (calibrations with window curves), which a schedule's
        rounds do not include: choosing, looking up the plan, starting and finishing the call."""
        c = self.calibration or {}
        return float(c.get("call_overhead_s", 0.0)) if "window_s" in c else 0.0


    def topology_for(self, nbytes: int):
        """The topology with the link bandwidth and reduction rate calibrated at this size (when the file has
        curves; see benchmark.calibrate.sized_overrides), else the file's topology as is."""
        if not self.calibration or "exchange_s" not in self.calibration:
            return self.topology
        if nbytes not in self._sized:
            from ..kernels._dtypes import dtype_name
            from ..topology import from_dict
            from .calibrate import sized_overrides

            d = self.topology.to_dict()
            d.update(sized_overrides(self.calibration, nbytes, dtype_name(self.dtype)))
            self._sized[nbytes] = from_dict(d)
        return self._sized[nbytes]


class Bench:
    def __init__(self, comm, opts: Options) -> None:
        from ..transport.mpi_library import MPI

        self.MPI = MPI
        self.comm = comm
        self.ctl = comm.mpi_comm.Dup()  # the bench's own barriers and reductions
        self.opts = opts
        self.p = comm.size
        self.rank = comm.rank
        self.records: list[dict] = []
        self.pattern = Pattern(opts.dtype, opts.op if opts.collective in fmt.REDUCING else "sum", self.p)
        self.predictor = None
        if opts.predict:  # every rank loads it (cheap, and a bad file fails everywhere alike)
            self.predictor = Predictor(opts.predict, self.p, opts.dtype, opts.op, opts.root)
    def emit(self, line: str) -> None:
        if self.rank == 0:
            print(line, file=self.opts.out, flush=True)

    # -- one collective call -----------------------------------------------------------------------------------
    def count_for(self, nbytes: int) -> int:
        """nccl-tests' element count for a size: full buffer, a multiple of p for reduce_scatter/allgather."""
        count = nbytes // self.opts.dtype.itemsize
        if self.opts.collective in ("reduce_scatter", "allgather"):
            count -= count % self.p
        return count

    def buffers(self, count: int, in_place: bool):
        """(x, out, expected or None) for this rank, inputs freshly initialised."""
        c, r, p, pat = self.opts.collective, self.rank, self.p, self.pattern
        root = self.opts.root
        if c == "allreduce":
            x = pat.input(r, 0, count)
            return x, (x if in_place else np.empty_like(x)), (lambda: pat.reference(0, count))
        if c == "reduce":
            x = pat.input(r, 0, count)
            out = x if in_place else np.empty_like(x)
            return x, out, ((lambda: pat.reference(0, count)) if r == root else None)
        if c == "reduce_scatter":
            k = count // p
            x = pat.input(r, 0, count)
            return x, np.empty(k, x.dtype), (lambda: pat.reference(r * k, k))
        if c == "allgather":
            k = count // p
            x = pat.input(r, r * k, k)
            return x, np.empty(count, x.dtype), (lambda: pat.gathered(k))
        # broadcast: in place by API; the root holds the data, the others a filler no pattern value equals
        x = pat.input(root, 0, count) if r == root else pat.filler(count)
        return x, x, (lambda: pat.input(root, 0, count))

    def call(self, spec: AlgoSpec, x, out):
        c, comm, o = self.opts.collective, self.comm, self.opts
        if c == "allreduce":
            return comm.allreduce(x, out=out, op=o.op, algorithm=spec.name, **spec.params)
        if c == "reduce":
            return comm.reduce(x, out=out, root=o.root, op=o.op, algorithm=spec.name, **spec.params)
        if c == "reduce_scatter":
            return comm.reduce_scatter(x, out=out, op=o.op, algorithm=spec.name, **spec.params)
        if c == "allgather":
            return comm.allgather(x, out=out, algorithm=spec.name, **spec.params)
        return comm.broadcast(x, root=o.root, algorithm=spec.name, **spec.params)

    def timed(self, fn) -> tuple[np.ndarray, np.ndarray]:
        """(per-iteration max over ranks, [mean, min, max] over ranks of each rank's mean) in seconds."""
        MPI, o = self.MPI, self.opts
        for _ in range(o.warmup):
            fn()
        ts = np.empty(o.iters)
        for k in range(o.iters):
            self.ctl.Barrier()
            t0 = time.perf_counter()
            fn()
            ts[k] = time.perf_counter() - t0
        slowest = np.empty_like(ts)
        self.ctl.Allreduce(ts, slowest, MPI.MAX)
        mine = float(ts.mean()) if ts.size else 0.0
        rank_stats = np.array([self.ctl.allreduce(mine, MPI.SUM) / self.p, self.ctl.allreduce(mine, MPI.MIN),
                               self.ctl.allreduce(mine, MPI.MAX)])
        return slowest, rank_stats

    def measure(self, spec: AlgoSpec, nbytes: int, count: int, in_place: bool) -> dict:
        o = self.opts
        x, out, expected = self.buffers(count, in_place)
        wrong = None
        if o.check:
            result = self.call(spec, x, out)
            bad = 0
            if expected is not None:
                got = x if o.collective == "broadcast" else out
                bad = count_wrong(got if result is None else result, expected())
            wrong = int(self.ctl.allreduce(bad, self.MPI.SUM))
        chosen = self.comm.last_choice
        slowest, rank_stats = self.timed(lambda: self.call(spec, x, out))
        chosen = self.comm.last_choice or chosen
        seconds = _stat(slowest, o.stat)
        algbw, busbw = fmt.bandwidths(o.collective, nbytes, seconds, self.p)
        ran = chosen.algorithm if chosen is not None else spec.name
        params = dict(chosen.params) if chosen is not None else dict(spec.params)
        return {"collective": o.collective, "algorithm": spec.label, "ran": ran, "params": params,
                "reason": chosen.reason if chosen is not None else "", "nranks": self.p, "size": nbytes,
                "count": count, "dtype": _dtype_name(o.dtype), "op": o.op if o.collective in fmt.REDUCING else "none",
                "root": o.root if o.collective in fmt.ROOTED else -1, "in_place": in_place, "stat": o.stat,
                "time_us": seconds * 1e6, "algbw": algbw, "busbw": busbw, "wrong": wrong,
                "iters": o.iters, "warmup": o.warmup, "times_us": [t * 1e6 for t in slowest.tolist()],
                "rank_mean_us": rank_stats[0] * 1e6, "rank_min_us": rank_stats[1] * 1e6,
                "rank_max_us": rank_stats[2] * 1e6}

    def skip_reason(self, spec: AlgoSpec) -> str | None:
        from ..transport.choose import native_supports

        if spec.name == "native" and not native_supports(self.opts.dtype, self.opts.collective):
            return "native skipped: MPI has no bfloat16 type"
        return None

    def predicted(self, rec: dict) -> float | None:
        if self.predictor is None:
            return None
        try:
            return self.predictor.predict(rec["collective"], rec["ran"], rec["params"], rec["size"])
        except Exception as exc:  # noqa: BLE001 - a prediction must never stop the measurement
            rec["predict_error"] = f"{type(exc).__name__}: {exc}"
            return None

    # -- the two layouts ---------------------------------------------------------------------------------------
    def hosts(self) -> list[tuple[int, int, str]]:
        return self.ctl.gather((self.rank, os.getpid(), socket.gethostname()), root=0) or []

    def host_names(self, hosts: list[tuple[int, int, str]]) -> list[str]:
        return self.ctl.bcast(sorted({h for _, _, h in hosts}) if self.rank == 0 else None, root=0)

    def run_nccl(self) -> int:
        from .host_load import BUSY_SHARE, HostLoad, expected_share

        o = self.opts
        hosts = self.hosts()
        has_in_place = o.in_place and o.collective not in ("reduce_scatter", "allgather")
        warnings = self.predictor.warnings(self.host_names(hosts)) if self.predictor is not None else []
        for line in fmt.header(collective=o.collective, world_size=self.p, min_bytes=o.sizes[0],
                               max_bytes=o.max_bytes if o.max_bytes is not None else o.sizes[-1], step=o.step,
                               warmup=o.warmup, iters=o.iters, check=int(o.check), stat=o.stat, hosts=hosts,
                               predict=o.predict, comm_check=self.comm.check,
                               predicted_column="in-place" if has_in_place else "out-of-place"):
            self.emit(line)
        for w in warnings:
            self.emit(f"# warning: {w}")
        for spec in o.algorithms:
            why = self.skip_reason(spec)
            if why:
                self.emit(f"# {why}")
        type_name = fmt.NCCL_TYPE_NAMES.get(_dtype_name(o.dtype), _dtype_name(o.dtype))
        redop = o.op if o.collective in fmt.REDUCING else "none"
        root = o.root if o.collective in fmt.ROOTED else -1
        host = self.comm.host
        load = HostLoad(expected_share(host.ranks_per_host, host.cores), host.cores, host.ranks_per_host)
        busy_sizes: list[int] = []
        errors: dict[str, list[float]] = {}
        for nbytes_asked in o.sizes:
            count = self.count_for(nbytes_asked)
            nbytes = count * o.dtype.itemsize
            if load.probe(self.ctl) < BUSY_SHARE * load.expected:
                busy_sizes.append(nbytes)
            for spec in o.algorithms:
                if self.skip_reason(spec):
                    continue
                oop = self.measure(spec, nbytes, count, in_place=False)
                ip = self.measure(spec, nbytes, count, in_place=True) if has_in_place else None
                pred = error = None
                if self.rank == 0 and self.predictor is not None:
                    pred = self.predicted(oop)
                    measured = (ip or oop)["time_us"]
                    if pred is not None and measured > 0:
                        error = pred * 1e6 / measured - 1
                        errors.setdefault(spec.label, []).append(error)
                    for rec in (oop, ip):
                        if rec is not None:
                            rec["predicted_us"] = None if pred is None else pred * 1e6
                            rec["prediction_error"] = error
                self.records += [oop] + ([ip] if ip else [])
                shown = spec.label if spec.name != "auto" else f"auto->{oop['ran']}"
                self.emit(fmt.row(nbytes=nbytes, count=count, type_name=type_name, redop=redop, root=root,
                                  out_of_place=oop, in_place=ip, algorithm=shown,
                                  predicted_us=None if pred is None else pred * 1e6, predict=bool(o.predict),
                                  error=error))
        wrong = sum(r["wrong"] or 0 for r in self.records)
        per_algo: dict[str, list[float]] = {}
        for r in self.records:
            per_algo.setdefault(r["algorithm"], []).append(r["busbw"])
        for line in fmt.footer(wrong, {k: float(np.mean(v)) for k, v in per_algo.items()}):
            self.emit(line)
        if o.predict:
            for line in fmt.prediction_summary(errors, "in-place" if has_in_place else "out-of-place"):
                self.emit(line)
        busy = ""
        if busy_sizes:
            busy = (f"other processes took the CPU while measuring {len(busy_sizes)} of {len(o.sizes)} sizes "
                    f"({', '.join(human(n) for n in busy_sizes[:6])}{', ...' if len(busy_sizes) > 6 else ''}): "
                    f"{load.describe()}")
            self.emit(f"# warning: {busy}")
        self.write_files()
        if self.rank == 0 and (warnings or busy):
            self.tell_stderr(warnings + ([busy] if busy else []), errors)
        return 1 if wrong else 0

    def tell_stderr(self, warnings: list[str], errors: dict[str, list[float]]) -> None:
        """The table's warnings once more on stderr, where a reader of the numbers alone still sees them."""
        from .host_load import WHAT_TO_DO

        for w in warnings:
            print(f"collectives bench: warning: {w}", file=sys.stderr)
        print("collectives bench: warning: " + ("predictions above may be far off: " + WHAT_TO_DO if errors else
                                                "measurements above may be far off: rerun when the host is quiet "
                                                "(`uptime` shows the load; stop other jobs)"),
              file=sys.stderr, flush=True)

    def run_osu(self) -> int:
        o = self.opts
        for line in fmt.osu_header(o.collective, o.osu_full):
            self.emit(line)
        for spec in o.algorithms:
            why = self.skip_reason(spec)
            if why:
                self.emit(f"# {why}")
                continue
            self.emit(f"# Algorithm: {spec.label}")
            for nbytes_asked in o.sizes:
                count = self.count_for(nbytes_asked)
                nbytes = count * o.dtype.itemsize
                rec = self.measure(spec, nbytes, count, in_place=False)
                if self.rank == 0 and self.predictor is not None:
                    pred = self.predicted(rec)
                    rec["predicted_us"] = None if pred is None else pred * 1e6
                self.records.append(rec)
                line = fmt.osu_row(nbytes, rec["rank_mean_us"], rec["rank_min_us"], rec["rank_max_us"], o.iters,
                                   o.osu_full)
                if spec.name == "auto":
                    line += f"  # auto->{rec['ran']}"
                self.emit(line)
        wrong = sum(r["wrong"] or 0 for r in self.records)
        if o.check:
            self.emit(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}")
        self.write_files()
        return 1 if wrong else 0

    def write_files(self) -> None:
        if self.rank != 0:
            return
        o = self.opts
        if o.json_path:
            with open(o.json_path, "w") as f:
                json.dump({"collective": o.collective, "nranks": self.p, "dtype": _dtype_name(o.dtype), "op": o.op,
                           "iters": o.iters, "warmup": o.warmup, "stat": o.stat, "predict": o.predict,
                           "measurements": self.records}, f, indent=1)
                f.write("\n")
        if o.csv_path:
            cols = ["collective", "algorithm", "ran", "nranks", "size", "count", "dtype", "op", "root", "in_place",
                    "stat", "time_us", "algbw", "busbw", "wrong", "predicted_us", "prediction_error", "rank_mean_us",
                    "rank_min_us",
                    "rank_max_us", "iters", "warmup"]
            with open(o.csv_path, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
                w.writeheader()
                for r in self.records:
                    w.writerow(r)

    def run(self) -> int:
        try:
            return self.run_osu() if self.opts.osu else self.run_nccl()
        finally:
            self.ctl.Free()


def _dtype_name(dtype: np.dtype) -> str:
    from ..kernels._dtypes import dtype_name

    return dtype_name(np.dtype(dtype))
