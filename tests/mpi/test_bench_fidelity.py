"""bench/fidelity.py's table: each run paired with its own prediction, the median error over runs decides."""

from __future__ import annotations

import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location("fidelity", Path(__file__).parents[2] / "bench" / "fidelity.py")
fidelity = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fidelity)


def _run(rows):
    return {"measurements": [{"algorithm": a, "size": s, "in_place": ip, "time_us": t, "predicted_us": p}
                             for a, s, ip, t, p in rows]}


def test_each_run_is_paired_with_its_own_prediction_and_the_median_error_decides():
    runs = [_run([("ring", 1 << 20, True, 100.0, 110.0), ("ring", 1 << 20, False, 999.0, 110.0),
                  ("native", 1 << 20, True, 50.0, None), ("dbt", 1 << 20, True, 300.0, 100.0)]),
            _run([("ring", 1 << 20, True, 200.0, 150.0), ("dbt", 1 << 20, True, 100.0, 100.0)]),
            _run([("ring", 1 << 20, True, 120.0, 120.0), ("dbt", 1 << 20, True, 110.0, 100.0)])]
    lines, ok, total = fidelity.table(2, runs)
    assert total == 2  # native and out-of-place rows are not predictions of the schedule
    # ring: per-run errors +10%, -25%, 0% -> median 0%; dbt: -67%, 0%, -9% -> median -9%
    assert ok == 2
    assert any(line.startswith("| 1 MiB | ring | 100/110, 200/150, 120/120 | 120 | 120 | +0% | yes |") for line in lines)
    assert any(line.startswith("| 1 MiB | dbt | 300/100, 100/100, 110/100 | 110 | 100 | -9% | yes |") for line in lines)
    # per run: run 0 dbt is -67% off, run 1 ring -25% (inside), run 2 both inside
    assert lines[-1].endswith("per run: 1 of 2, 2 of 2, 2 of 2")


def test_runs_in_two_states_are_judged_by_their_own_predictions_not_by_crossed_medians():
    """Two launches measured and calibrated in a fast state, two in a slow one, one calibrated slow and measured
    fast: every launch but the last predicts its own measurement, so the median error is small, while the
    median prediction (slow) against the median measurement (fast) is far off."""
    rows = [(150.0, 160.0), (150.0, 140.0), (640.0, 600.0), (650.0, 660.0), (150.0, 640.0)]
    lines, ok, total = fidelity.table(2, [_run([("ring", 4 << 20, True, t, p)]) for t, p in rows])
    assert (ok, total) == (1, 1)
    assert "median prediction against median measurement: 0 of 1" in lines[-1]


def test_a_median_outside_the_tolerance_is_a_miss():
    lines, ok, total = fidelity.table(4, [_run([("ring", 64 << 10, True, 100.0, 140.0)])])
    assert (ok, total) == (0, 1) and "| 64 KiB | ring | 100/140 | 100 | 140 | +40% | no |" in lines


def test_help_of_every_bench_script_prints():
    """argparse formats help strings with %: a literal percent sign must be escaped, or --help crashes."""
    import subprocess
    import sys

    for script in sorted((Path(__file__).parents[2] / "bench").glob("*.py")):
        proc = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and "usage:" in proc.stdout, (script.name, proc.stderr[-2000:])


def test_rows_run_with_the_cores_placed_otherwise_are_marked_and_counted_apart():
    """bench records the core-to-core distance per size, calibrations before and after their window rounds; a
    row more than 3x away (either way) ran in another placement of the host's cores: marked *, and a line gives
    the cells' count without those rows, while the headline keeps every run."""
    def run(t: float, p: float, ns: float) -> dict:
        return {"measurements": [{"algorithm": "ring", "size": 4 << 20, "in_place": True, "time_us": t,
                                  "predicted_us": p, "core_to_core_ns": ns}]}

    near = {"core_to_core_s": [40e-9, 45e-9]}
    runs = [run(100.0, 105.0, 42.0), run(300.0, 100.0, 230.0), run(320.0, 100.0, 240.0)]
    lines, ok, total = fidelity.table(4, runs, [near, near, near])
    assert (ok, total) == (0, 1)  # two of three runs are 3x off: the paired median misses
    assert any("| 4 MiB | ring | 100/105, 300/100*, 320/100* |" in line for line in lines)
    assert lines[-1].startswith("2 of 3 rows (*) ran with the host's cores placed otherwise")
    assert lines[-1].endswith("counting only the other rows: 1 of 1 within 25%")
    assert fidelity.moved({"core_to_core_ns": 42.0}, near) is False
    assert fidelity.moved({"core_to_core_ns": 12.0}, near) is True  # closer counts too
    assert fidelity.moved({}, near) is False and fidelity.moved({"core_to_core_ns": 240.0}, None) is False
    plain, _, _ = fidelity.table(4, runs)  # without calibrations (older runs) nothing is marked
    assert not any("*" in line or "placed otherwise" in line for line in plain)


def test_the_scripts_that_explain_misses_run_and_add_up(tmp_path):
    """bench/tree_steps.py and bench/rounds_vs_call.py, briefly, under the venv's mpiexec (bounded): the steps'
    sum is the sum of the printed steps, and the price is (p - 1) x (copy + reduce round)."""
    import os
    import re
    import subprocess
    import sys

    import pytest

    mpiexec = Path(sys.executable).parent / "mpiexec"
    if not mpiexec.exists():
        pytest.skip("no mpiexec in the venv")
    bench = Path(__file__).parents[2] / "bench"
    env = dict(os.environ, MPIEXEC_TIMEOUT="90", COLLECTIVES_TIMEOUT="30",
               COLLECTIVES_CALIBRATION=str(tmp_path / "default-calibration.json"))

    def run(n, *argv):
        proc = subprocess.run([str(mpiexec), "-n", str(n), sys.executable, *map(str, argv)], capture_output=True,
                              text=True, timeout=120, env=env, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout

    out = run(4, bench / "tree_steps.py", "--mib", "1", "--reps", "1")
    steps = [float(m) for m in re.findall(r"^(?:copy-in|3-input reduce \+|2-input reduce \+|landing \+|landing, all)"
                                          r".*?([0-9.]+) ms$", out, re.M)]
    assert len(steps) == 5, out
    total, call = map(float, re.search(r"call's order: ([0-9.]+) ms; the call \(chunks=1\): ([0-9.]+) ms", out).groups())
    assert abs(total - sum(steps)) <= 0.08 and call > 0  # printed to 0.1 ms, the steps to 0.01
    assert re.search(r"^double_binary_tree chunks=16 +[0-9.]+ ms", out, re.M), out

    out = run(2, bench / "rounds_vs_call.py", "--mib", "1", "--pairs", "2")
    rows = re.findall(r"copy +([0-9.]+) +reduce +([0-9.]+) +price +([0-9]+) +ring +([0-9]+)", out)
    assert len(rows) == 2, out
    for copy, reduce, price, ring in rows:
        assert abs(float(price) - (float(copy) + float(reduce))) <= 1.0 and float(ring) > 0
