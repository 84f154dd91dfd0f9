"""`collectives bench` and `collectives calibrate` under mpiexec (tests/mpi/launcher.py; few short launches,
< 90 s total), plus the pure helpers (sizes, nccl-tests formatting, reference data) without MPI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import launcher
import numpy as np
import pytest

from collectives.benchmark import format as fmt
from collectives.benchmark.data import Pattern, count_wrong
from collectives.units import parse_size, sweep

CLI = Path(sys.executable).parent / "collectives"
TIMEOUT = 60

needs_cli = pytest.mark.skipif(not CLI.exists(), reason=f"no `collectives` command next to {sys.executable}")


def mpirun(n: int, *args: str, tmp_path: Path, timeout: int = TIMEOUT) -> subprocess.CompletedProcess:
    return launcher.run(n, [str(CLI), *args], timeout=timeout, cwd=tmp_path, env={
        "COLLECTIVES_TIMEOUT": "30", "COLLECTIVES_CALIBRATION": str(tmp_path / "default-calibration.json")})


def table_rows(stdout: str) -> list[list[str]]:
    return [line.split() for line in stdout.splitlines() if line.strip() and not line.startswith("#")]


# -- pure helpers ------------------------------------------------------------------------------------------------
def test_sizes():
    assert [parse_size(s) for s in ("8", "64K", "1M", "1.5M", "2G", "4KB", "1MiB")] == \
        [8, 65536, 1 << 20, 3 << 19, 2 << 30, 4096, 1 << 20]
    assert sweep(8, 128, factor=2) == [8, 16, 32, 64, 128]
    assert sweep(8, 64 << 20, factor=4)[-1] == 32 << 20
    assert sweep(100, 400, increment=100) == [100, 200, 300, 400]
    with pytest.raises(ValueError):
        parse_size("12X")


def test_row_keeps_nccl_fields_in_place():
    res = {"time_us": 123.456, "algbw": 1.5, "busbw": 2.25, "wrong": 0}
    line = fmt.row(nbytes=1048576, count=262144, type_name="float", redop="sum", root=-1, out_of_place=res,
                   in_place=res, algorithm="auto->ring", predicted_us=110.0, predict=True)
    f = line.split()
    assert f[:5] == ["1048576", "262144", "float", "sum", "-1"]
    assert f[5:13] == ["123.5", "1.50", "2.25", "0", "123.5", "1.50", "2.25", "0"]
    assert f[13:] == ["110.0", "auto->ring"]
    assert line.startswith(f"{1048576:12d}  {262144:12d}  {'float':>8}  {'sum':>6}  {-1:6d}")
    assert fmt.time_str(12345.6).strip() == "12346" and fmt.time_str(5.0) == "   5.00"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "int8", "uint32", "float64"])
@pytest.mark.parametrize("op", ["sum", "prod", "min", "max"])
def test_reference_is_exact(dtype, op):
    from collectives.kernels import reduce_into
    from collectives.kernels._dtypes import SUPPORTED_DTYPES, dtype_name

    dt = {dtype_name(d): d for d in SUPPORTED_DTYPES}[dtype]
    p, count = 5, 3001
    pat = Pattern(dt, op, p)
    inputs = [pat.input(r, 0, count) for r in range(p)]
    got = inputs[0].copy()
    reduce_into(got, [got, *inputs[1:]], op)
    assert count_wrong(got, pat.reference(0, count)) == 0
    got[17] += 1
    assert count_wrong(got, pat.reference(0, count)) == 1


# -- under mpiexec -----------------------------------------------------------------------------------------------
@needs_cli
def test_bench_allreduce_table_json_csv(tmp_path):
    proc = mpirun(2, "bench", "allreduce", "-b", "8", "-e", "64K", "-f", "8", "-n", "3", "-w", "1", "-d", "half",
                  "--algorithms", "native,auto,ring,rabenseifner", "--json", "m.json", "--csv", "m.csv",
                  tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "#       size         count      type   redop    root     time   algbw   busbw #wrong" in out
    assert "# Out of bounds values : 0 OK" in out and "# Avg bus bandwidth    : " in out
    assert "minBytes 8 maxBytes 65536 " in out  # -e as asked, though the x8 sweep stops at 32K
    rows = table_rows(out)
    assert len(rows) == 5 * 4  # sizes 8, 64, 512, 4K, 32K x four algorithms
    for f in rows:
        assert f[2] == "half" and f[3] == "sum" and f[4] == "-1"
        float(f[5]), float(f[6]), float(f[7]), float(f[9])
        assert f[8] == "0" and f[12] == "0"
    assert {f[-1] for f in rows} >= {"native", "ring", "rabenseifner"}
    assert any(f[-1].startswith("auto->") for f in rows)
    data = json.loads((tmp_path / "m.json").read_text())
    assert len(data["measurements"]) == 2 * len(rows)  # out-of-place and in-place
    assert all(len(m["times_us"]) == 3 for m in data["measurements"])
    assert (tmp_path / "m.csv").read_text().count("\n") == 1 + 2 * len(rows)


@needs_cli
def test_calibrate_then_predict_and_osu(tmp_path):
    proc = mpirun(2, "calibrate", "--out", "cal.json", "--quick", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "transport round cost" in proc.stdout and "the transport's rounds" in proc.stdout
    cal = json.loads((tmp_path / "cal.json").read_text())["calibration"]
    assert set(cal["window_s"]) == {"copy_round", "reduce_round"}
    # ring (2(p-1) rounds) against one_shot (1 round): at p=2 either share can come out as nothing measurable
    # (a round under the runner, or a call when the ring's second round was slowed), never both, never negative
    assert cal["round_s"] >= 0 and cal["call_overhead_s"] >= 0 and cal["transport_round_s"] > 0
    assert cal["round_s"] + cal["call_overhead_s"] > 0
    assert all(t > 0 for curve in cal["window_s"].values() for _, t in curve)
    assert cal["ranks_per_host"] == 2 and cal["cores"] >= 1
    assert "2 per host on" in proc.stdout
    from collectives.simulate import simulate
    from collectives.topology import load

    topo = load(tmp_path / "cal.json")
    assert topo.world_size == 2 and topo.to_dict()["nvlink_bandwidth"] > 0
    assert (tmp_path / "default-calibration.json").is_file()  # $COLLECTIVES_CALIBRATION: what preset reads
    assert simulate("ring", topo, 1 << 20).time > 0

    proc = mpirun(2, "bench", "reduce_scatter", "-b", "1K", "-e", "16K", "-f", "4", "-n", "2", "-w", "1",
                  "--algorithms", "native,ring", "--predict", "cal.json", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = table_rows(proc.stdout)
    assert len(rows) == 3 * 2
    for f in rows:
        assert f[9:13] == ["N/A"] * 4  # no in-place reduce_scatter in the Communicator API
        assert (f[-2] == "n/a") == (f[-1] == "native")
        if f[-1] == "ring":
            assert float(f[-2]) > 0

    proc = mpirun(2, "bench", "broadcast", "-b", "4", "-e", "4K", "-f", "32", "-n", "2", "-w", "0", "--osu", "--full",
                  "-r", "1", "--algorithms", "native,binomial", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "# OSU MPI Broadcast Latency Test" in proc.stdout
    assert "# Size       Avg Latency(us)" in proc.stdout
    assert len(table_rows(proc.stdout)) == 3 * 2


@needs_cli
def test_wrong_results_fail_on_every_rank(tmp_path, monkeypatch):
    """A corrupted result on rank 1 only (a sitecustomize wraps Communicator.allgather) makes every rank exit 1."""
    (tmp_path / "sitecustomize.py").write_text(
        "from collectives.transport.communicator import Communicator\n"
        "_orig = Communicator.allgather\n"
        "def bad(self, *a, **k):\n"
        "    out = _orig(self, *a, **k)\n"
        "    if self.rank == 1 and out.size: out[0] += 1\n"
        "    return out\n"
        "Communicator.allgather = bad\n")
    env_path = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{env_path}" if env_path else str(tmp_path))
    proc = mpirun(2, "bench", "allgather", "-b", "64", "-e", "64", "-n", "1", "-w", "0", "--algorithms", "ring",
                  tmp_path=tmp_path)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "# Out of bounds values : 0 OK" not in proc.stdout
    assert "FAILED" in proc.stdout


@needs_cli
def test_usage_errors_exit_2(tmp_path):
    proc = mpirun(2, "bench", "allreduce", "-b", "8", "-e", "8", "--algorithms", "nosuch", tmp_path=tmp_path)
    assert proc.returncode == 2 and "unknown algorithm 'nosuch'" in proc.stderr


def _predict_ring_with(tmp_path, calibration: dict) -> float:

    from collectives.benchmark.runner import Predictor
    from collectives.topology import preset, save

    path = tmp_path / "cal.json"
    save(preset("loopback", ranks=2), path)
    data = json.loads(path.read_text())
    data["calibration"] = calibration
    path.write_text(json.dumps(data))
    return Predictor(str(path), 2, np.dtype(np.float32), "sum", 0).predict("allreduce", "ring", {}, 1 << 20)


_SIZES = [64 << 10, 64 << 20]
_FIXED = {"round_s": 15e-6, "call_overhead_s": 30e-6, "exchange_s": [[d, 1e-3] for d in _SIZES],
          "reduce_curve": {"float32": [[d, 1e10] for d in _SIZES], "float16": [[d, 5e9] for d in _SIZES]}}


def test_window_calibration_prices_a_round_as_the_shared_memory_executor_runs_it(tmp_path):
    """bench --predict with the round curves: at p=2 a ring allreduce (two rounds: the half the peer reduces is
    mirrored and reduced, the result half mirrored and landed) costs 2 rounds' latency + a reduce round + a
    copy round, plus the per-call cost; other dtypes' reductions scale by the kernels' measured throughput."""
    from collectives.benchmark.calibrate import window_overrides

    copy_round, reduce_round = 30e-6, 70e-6
    calibration = {"ranks": 2, "window_s": {"copy_round": [[d, copy_round] for d in _SIZES],
                                            "reduce_round": [[d, reduce_round] for d in _SIZES]}, **_FIXED}
    over = window_overrides(calibration, 1 << 20, "float16")
    m = (1 << 20) / 2
    assert over["nvlink_bandwidth"] == pytest.approx(m / copy_round)
    assert over["reduce_bandwidth"]["float32"] == pytest.approx(m / (reduce_round - copy_round))
    assert over["reduce_bandwidth"]["float16"] == pytest.approx(m / (2 * (reduce_round - copy_round)))
    assert over["reduce_bandwidth"]["default"] == over["reduce_bandwidth"]["float16"]
    predicted = _predict_ring_with(tmp_path, calibration)
    assert predicted == pytest.approx(30e-6 + 2 * 15e-6 + copy_round + reduce_round, rel=0.01)


def test_calibrations_with_separate_window_phases_still_predict(tmp_path):
    """A calibration written before the round curves (mirror, land and reduce phases apart) reads as copy round =
    mirror + land and reduce round = mirror + reduce."""
    mirror, land, reduce = 10e-6, 20e-6, 50e-6
    calibration = {"ranks": 2, "window_s": {k: [[d, v] for d in _SIZES] for k, v in
                                            (("mirror", mirror), ("land", land), ("reduce", reduce))}, **_FIXED}
    predicted = _predict_ring_with(tmp_path, calibration)
    assert predicted == pytest.approx(30e-6 + 2 * 15e-6 + 2 * mirror + land + reduce, rel=0.01)


def test_window_rounds_are_a_ring_call_less_the_fixed_costs(monkeypatch):
    """calibrate's copy (reduce) round at size D: a ring allgather (reduce_scatter) of D bytes through the
    transport, less the per-call and per-round costs, over its p - 1 rounds."""
    from types import SimpleNamespace

    from collectives.benchmark import calibrate

    timed = {"allgather": 900e-6, "reduce_scatter": 1300e-6}
    calls = []

    def concurrent(ctl, fn, reps):
        calls.append(fn())
        return timed[calls[-1]]

    monkeypatch.setattr(calibrate, "_concurrent", concurrent)
    comm = SimpleNamespace(size=3, mpi_comm=None, allgather=lambda *a, **k: "allgather",
                           reduce_scatter=lambda *a, **k: "reduce_scatter")
    fixed = {"call_overhead_s": 100e-6, "round_s": 50e-6}
    out = calibrate.window_rounds(comm, fixed, sizes=[1 << 20])
    assert out["copy_round"] == [[1 << 20, pytest.approx((900e-6 - 100e-6 - 2 * 50e-6) / 2)]]
    assert out["reduce_round"] == [[1 << 20, pytest.approx((1300e-6 - 100e-6 - 2 * 50e-6) / 2)]]


@needs_cli
def test_bench_calibrates_in_its_own_launch_then_predicts(tmp_path):
    """`bench --calibrate --predict FILE` measures the host first (as `collectives calibrate`), writes FILE and
    predicts from it; without --predict it is a usage error on every rank, before anything is measured."""
    proc = mpirun(2, "bench", "allreduce", "-b", "64K", "-e", "64K", "--algorithms", "ring", "--calibrate",
                  tmp_path=tmp_path)
    assert proc.returncode == 2 and "--calibrate needs --predict FILE" in proc.stderr
    assert "# calibrate:" not in proc.stderr
    proc = mpirun(2, "bench", "allreduce", "-b", "64K", "-e", "64K", "--algorithms", "ring", "--calibrate",
                  "--predict", "here.json", "-n", "2", "-w", "1", "--json", "m.json", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cal = json.loads((tmp_path / "here.json").read_text())["calibration"]
    assert cal["ranks"] == 2 and set(cal["window_s"]) == {"copy_round", "reduce_round"}
    assert not (tmp_path / "default-calibration.json").exists()  # like calibrate --no-default
    measured = json.loads((tmp_path / "m.json").read_text())["measurements"]
    assert measured and all(m["predicted_us"] > 0 for m in measured)


@needs_cli
@pytest.mark.any_mpi
@pytest.mark.parametrize("where", ["calibrate", "bench"])
def test_a_rank_failing_alone_ends_the_job_at_once(tmp_path, where):
    """Rank 1 raises in the middle of a measurement while rank 0 waits in a collective: the job ends within
    seconds with a non-zero status and rank 1's error (not after the 30-60 s timeouts, not with a hang)."""
    import time

    program = Path(__file__).parent / "programs" / "failing_rank.py"
    args = (["calibrate", "--out", "cal.json", "--no-default", "--quick"] if where == "calibrate" else
            ["bench", "allreduce", "-b", "64K", "-e", "64K", "-n", "2", "-w", "1", "--algorithms", "ring"])
    start = time.monotonic()
    proc = launcher.run(2, [sys.executable, str(program), where, "1", *args], timeout=90, cwd=tmp_path, env={
        "COLLECTIVES_TIMEOUT": "60", "COLLECTIVES_CALIBRATION": str(tmp_path / "default-calibration.json")})
    elapsed = time.monotonic() - start
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert elapsed < 25, (elapsed, proc.stderr[-2000:])
    assert f"collectives {where}: rank 1: error: RuntimeError: injected failure on rank 1" in proc.stderr, \
        proc.stderr[-3000:]
    assert not (tmp_path / "cal.json").exists()
