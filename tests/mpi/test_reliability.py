"""Issue 9 under mpiexec (tests/mpi/launcher.py: the MPI found, the job killed after its timeout): timeouts,
mismatched calls, bad inputs, determinism, accuracy of 16-bit reductions, and fault injection (a rank or a switch
daemon dies).

The MPI programs live in tests/mpi/programs/reliability.py (one mode per launch) and daemon_killer.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import launcher
import ml_dtypes
import numpy as np
import pytest

from collectives import algorithms, emulate, verify

PROGRAMS = Path(__file__).parent / "programs"
PROGRAM = PROGRAMS / "reliability.py"
BF16 = np.dtype(ml_dtypes.bfloat16)
Group = tuple[int, list[str]]  # an MPMD group: (ranks, argv)


def run(*groups: Group, timeout: float = 40, auto_cleanup: bool = True, **env) -> subprocess.CompletedProcess:
    """Launch `groups` (tests/mpi/launcher.py) with `env` added; the launcher kills the job after `timeout` s."""
    (n, argv), *more = groups
    return launcher.run(n, argv, *more, timeout=timeout, auto_cleanup=auto_cleanup, env=env)


def result(proc: subprocess.CompletedProcess) -> dict:
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def app(n: int, mode: str, timeout: float = 2.0) -> Group:
    return n, [sys.executable, str(PROGRAM), mode, "--timeout", str(timeout)]


def no_orphans(pattern: str) -> None:
    """No process of the job survives it (pgrep -f over the script's unique name)."""
    for _ in range(20):
        if subprocess.run(["pgrep", "-f", pattern], capture_output=True).returncode != 0:
            return
        time.sleep(0.25)
    left = subprocess.run(["pgrep", "-fa", pattern], capture_output=True, text=True).stdout
    pytest.fail(f"orphan processes remain:\n{left}")


# -- 1. no silent hang -----------------------------------------------------------------------------------------
@pytest.mark.any_mpi
def test_skipped_call_times_out_with_details():
    """Rank 1 skips call #2: rank 0 raises CollectiveTimeoutError within the timeout naming the collective,
    algorithm, op index, peer, last completed op and sequence number (check off: inside the schedule; check on:
    in the metadata agreement). Shared memory off: its executor reports no op index (see the report)."""
    res = result(run(app(2, "skip", 1.0), COLLECTIVES_SHM="0"))
    assert res["failures"] == 0, res["messages"]
    off = res["messages_by_check"]["off"]
    assert re.search(r"allreduce #2 \(algorithm ring\).*first unfinished op \d+ \(last completed op -?\d+\); "
                     r"awaiting rank 1", off), off
    assert "agreement" in res["messages_by_check"]["metadata"]


# -- 3. mismatched calls ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [2, pytest.param(3, marks=pytest.mark.any_mpi)])
def test_mismatched_calls_raise_on_every_rank(n):
    res = result(run(app(n, "mismatch")))
    assert res["failures"] == 0, res["messages"]
    assert "count differs" in res["details"]["async"]


# -- 4. bad inputs ---------------------------------------------------------------------------------------------
def test_bad_calls_catalogue():
    res = result(run(app(2, "bad")))
    assert res["failures"] == 0, res["messages"]
    assert res["cases"] >= 15
    assert "valid algorithms" in res["raised"]["unknown algorithm"]
    assert "closed" in res["raised"]["use after close"]


# -- 5./6. determinism and accumulate under MPI -----------------------------------------------------------------
@pytest.mark.parametrize("n", [3, 4])
def test_determinism_under_mpiexec(n):
    res = result(run(app(n, "determinism"), timeout=90))
    assert res["failures"] == 0, res["messages"]


# -- 2. rank and daemon failure ---------------------------------------------------------------------------------
def survivors(out: str) -> dict[int, tuple[float, str]]:
    found = {}
    for m in re.finditer(r"^SURVIVOR rank (\d+) elapsed=([\d.]+) (?:first_ok=\w+ )?error=(.*)$", out, re.M):
        found[int(m.group(1))] = (float(m.group(2)), m.group(3))
    return found


@pytest.mark.any_mpi
def test_rank_death_default_mpiexec_ends_the_job():
    t = time.monotonic()
    proc = run(app(3, "kill"), timeout=30)
    # the launcher kills the survivors and exits with the dead rank's status (3) or reports the termination
    assert launcher.job_was_ended(proc, 3), proc
    assert time.monotonic() - t < 25
    no_orphans(str(PROGRAM) + " kill")


@pytest.mark.any_mpi
def test_rank_death_fault_tolerant_survivors_raise():
    timeout = 2.0
    t = time.monotonic()
    # COLLECTIVES_SHM_C=0: the Python shared-memory executor returns to the caller between rounds, so rank 1 can
    # die with the call half done; the C plan runner usually finishes a whole call inside rank 1's one test()
    # (its bounded wait on a peer that never comes is tested in test_mpi.py::test_bad_calls_and_timeouts)
    launcher.skip_unless(auto_cleanup=False)
    proc = run(app(3, "kill", timeout), timeout=30, auto_cleanup=False, COLLECTIVES_SHM_C="0")
    wall = time.monotonic() - t
    found = survivors(proc.stdout)
    assert set(found) == {0, 2}, proc.stdout + proc.stderr
    for rank, (elapsed, error) in found.items():
        assert elapsed < 2 * timeout, (rank, elapsed)
        # the awaited peer is rank 1 or a survivor itself waiting for rank 1 (shared-memory rounds)
        assert "CollectiveTimeoutError" in error and "allreduce #2" in error and "awaiting rank" in error, error
    assert wall < 25
    if launcher.launcher().reports_failure(auto_cleanup=False):  # the survivors exited with status 1
        assert proc.returncode != 0
    no_orphans(str(PROGRAM) + " kill")


@pytest.mark.any_mpi
@pytest.mark.parametrize("cleanup", [True, False])
def test_switch_daemon_death(cleanup):
    timeout = 2.0
    daemon = (1, [sys.executable, "-m", "collectives.switchd", "--path", str(PROGRAMS), "--import", "daemon_killer"])
    launcher.skip_unless(auto_cleanup=cleanup)
    t = time.monotonic()
    proc = run(app(2, "daemon", timeout), daemon, timeout=30, auto_cleanup=cleanup)
    assert time.monotonic() - t < 25
    if launcher.launcher().reports_failure(auto_cleanup=cleanup):
        assert proc.returncode != 0
    if cleanup:  # the dead daemon's status (9) or the launcher's report
        assert launcher.job_was_ended(proc, 9), proc
    else:
        found = survivors(proc.stdout)
        assert set(found) == {0, 1}, proc.stdout + proc.stderr
        for elapsed, error in found.values():
            assert elapsed < 2 * timeout
            assert "switch node" in error and "switch daemon" in error, error
    no_orphans("daemon_killer")
    no_orphans(str(PROGRAM) + " daemon")


# -- 6. accuracy of bfloat16 reductions (emulator, 64 ranks) ----------------------------------------------------
def test_bfloat16_ring_allreduce_accuracy_64_ranks():
    p, n = 64, 2048
    rng = np.random.default_rng(7)
    xs = [rng.uniform(-1, 1, n).astype(BF16) for _ in range(p)]
    exact = np.sum([x.astype(np.float64) for x in xs], axis=0)
    abs_sum = np.sum([np.abs(x.astype(np.float64)) for x in xs], axis=0)
    sched = algorithms.build("ring", collective="allreduce", world_size=p, count=n)
    u = 2.0 ** -8  # bfloat16 unit roundoff
    err = {}
    for acc in (None, "float32"):
        out = emulate(sched, xs, accumulate=acc)
        assert all(np.array_equal(o.view(np.uint16), out[0].view(np.uint16)) for o in out)
        err[acc] = np.abs(out[0].astype(np.float64) - exact)
    # default: every hop rounds to bfloat16
    assert np.all(err[None] <= (p - 1) * u * abs_sum)
    # float32 accumulate: one final rounding plus float32 sums
    assert np.all(err["float32"] <= u * np.abs(exact) + p * 2.0 ** -24 * abs_sum)
    assert err["float32"].mean() * 4 < err[None].mean()
    assert err["float32"].max() * 4 < err[None].max()


def test_accumulate_is_a_noop_for_wide_types_and_validated():
    xs = [np.arange(5, dtype=np.float32) + r for r in range(3)]
    s = algorithms.build("ring", collective="allreduce", world_size=3, count=5)
    assert all(np.array_equal(a, b) for a, b in zip(emulate(s, xs), emulate(s, xs, accumulate="float32"),
                                                     strict=True))
    with pytest.raises(ValueError, match="accumulate"):
        emulate(s, xs, accumulate="float64")


# -- 5. direct: verified, and bitwise the rank-order fold whatever the chunking ----------------------------------
@pytest.mark.parametrize("p", range(1, 34))
def test_direct_verified_and_rank_order(p):
    rng = np.random.default_rng(p)
    for coll in ("allreduce", "reduce_scatter", "reduce"):
        count = 3 * p if coll == "reduce_scatter" else 2 * p + 1
        root = (p - 1) if coll == "reduce" else None
        xs = [(rng.standard_normal(count) * 1e3).astype(np.float32) for _ in range(p)]
        fold = xs[0].copy()
        for x in xs[1:]:
            fold = fold + x
        xb = [x.astype(BF16) for x in xs]
        fold16 = xb[0].astype(np.float32)
        for x in xb[1:]:
            fold16 = fold16 + x.astype(np.float32)
        fold16 = fold16.astype(BF16)
        for chunks in (1, 2, 5):
            s = algorithms.build("direct", collective=coll, world_size=p, count=count, root=root, chunks=chunks)
            verify(s)
            for inputs, want, view in ((xs, fold, np.uint32), (xb, fold16, np.uint16)):
                out = emulate(s, inputs)
                for r, o in enumerate(out):
                    if coll == "reduce" and r != root:
                        assert o is None
                        continue
                    k = count // p
                    ref = want[r * k:(r + 1) * k] if coll == "reduce_scatter" else want
                    assert np.array_equal(o.view(view), ref.view(view)), (p, coll, chunks, r)
