"""The MPI transport under mpiexec (the MPI tests/mpi/launcher.py finds): one launch per world size runs many
cases inside.

Each launch runs tests/mpi/programs/check_collectives.py, which checks every registered algorithm x collective
x dtype x op against the emulator (bitwise) and MPI's own collectives, and prints `RESULT {json}`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import launcher
import pytest

pytest.importorskip("mpi4py")

PROGRAMS = Path(__file__).parent / "programs"
CHECK = PROGRAMS / "check_collectives.py"
TIMEOUT = 150  # seconds per launch (oversubscribed on small machines)

Group = tuple[int, list[str]]  # an MPMD group: (ranks, argv)


def launch(*groups: Group, timeout: float = TIMEOUT, **options) -> dict:
    """Run `mpiexec -n A argv : -n B argv ...` (tests/mpi/launcher.py) and return rank 0's RESULT."""
    (n, argv), *more = groups
    cmd, env = launcher.command(n, argv, *more, timeout=timeout, env={"COLLECTIVES_TIMEOUT": "60"}, **options)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 15, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (
        f"{' '.join(cmd)} exited {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def app(n: int, *args: str) -> Group:
    return n, [sys.executable, str(CHECK), *args]


def daemons(n: int) -> Group:
    return n, [sys.executable, "-m", "collectives.switchd", "--path", str(PROGRAMS), "--import", "check_collectives"]


@pytest.mark.parametrize("world_size", [1, 2, pytest.param(3, marks=pytest.mark.any_mpi), 4, 5, 6, 7, 8])
def test_every_algorithm_and_collective(world_size):
    counts = ["0", "1", "7", "50"] if world_size <= 4 else ["0", "9", "40"] if world_size <= 6 else ["9", "40"]
    domains = ["--ranks-per-domain", "2"] if world_size in (4, 6, 8) else []  # 2-rank domains: switch trees
    # every dtype up to 4 ranks (domains included); above, where the schedules' shapes are what is new, one
    # integer, one float and the 16-bit float whose in-network offload differs from float32's
    dtypes = [] if world_size <= 4 else ["--dtypes", "int32", "float32", "bfloat16"]
    result = launch(app(world_size, "--counts", *counts, *domains, *dtypes))
    assert result["failures"] == 0, result["messages"]
    assert result["cases"] > 200
    if world_size > 1:  # in-network reduction: each rank injects D bytes, ring 2(p-1)/p D
        assert result["bytes_sent_per_rank"]["star"] == 4000
        assert result["bytes_sent_per_rank"]["ring"] >= 4000 + (world_size > 2)
        assert result["star_switch_bytes_on_rank0"] > 0  # leader emulation: rank 0 hosts a switch node


@pytest.mark.parametrize("world_size", [pytest.param(3, marks=pytest.mark.any_mpi), 4])
def test_python_shared_memory_executor(world_size, monkeypatch):
    """COLLECTIVES_SHM_C=0: the shared-memory executor's Python path (used where the C plan runner cannot
    serve) still gives MPI's results for every algorithm and collective."""
    monkeypatch.setenv("COLLECTIVES_SHM_C", "0")
    result = launch(app(world_size, "--counts", "1", "50"))
    assert result["failures"] == 0, result["messages"]
    assert result["cases"] > 200


@pytest.mark.parametrize("world_size,runner", [pytest.param(3, "1", marks=pytest.mark.any_mpi), (4, "1"), (3, "0")])
def test_single_copy_messages(world_size, runner, monkeypatch):
    """COLLECTIVES_SHM_SINGLE_COPY=4: every message of 4 bytes or more that its sender never changes during the
    call is read from the sender's memory (PEER_READ, shm/plan.py), in the C plan runner and in its Python
    interpreter: every algorithm and collective still gives the emulator's and MPI's results, in place or not."""
    monkeypatch.setenv("COLLECTIVES_SHM_SINGLE_COPY", "4")
    monkeypatch.setenv("COLLECTIVES_SHM_C", runner)
    result = launch(app(world_size, "--counts", "7", "50"))
    assert result["failures"] == 0, result["messages"]
    assert result["cases"] > 200
    assert result["single_copy_min"] == 4  # every rank could read its peers' memory


@pytest.mark.parametrize("world_size", [4, pytest.param(6, marks=pytest.mark.any_mpi)])
def test_two_hosts_on_one_machine(world_size, monkeypatch):
    """The path between hosts, in CI: COLLECTIVES_SHM=0 (no shared memory: every schedule runs with point-to-point
    messages, as between hosts) and `ranks_per_domain` (2 or 3 ranks per domain: the hierarchical and in-network
    schedules see two or three "hosts"): every algorithm and collective still gives the emulator's and MPI's
    results."""
    monkeypatch.setenv("COLLECTIVES_SHM", "0")
    per_domain = str(world_size // 2)
    dtypes = [] if world_size <= 4 else ["--dtypes", "int32", "float32", "bfloat16"]
    result = launch(app(world_size, "--counts", "1", "50", "--ranks-per-domain", per_domain, *dtypes))
    assert result["failures"] == 0, result["messages"]
    assert result["cases"] > 200
    assert not result["shared_memory"]  # every call ran on point-to-point messages


@pytest.mark.parametrize("world_size,num_daemons", [pytest.param(3, 2, marks=pytest.mark.any_mpi), (5, 1),
                                                    (4, 3)])
def test_switch_daemons(world_size, num_daemons):
    result = launch(app(world_size, "--only", "star", "ring", "native"), daemons(num_daemons))
    assert result["failures"] == 0, result["messages"]
    assert result["daemons"] == num_daemons
    assert result["star_switch_bytes_on_rank0"] == 0  # the switch nodes ran on the daemons
    assert result["bytes_sent_per_rank"]["star"] == 4000


@pytest.mark.any_mpi
def test_bad_calls_and_timeouts(tmp_path):
    """22 bad calls (bad timeouts included) raise before communicating; a missing peer raises CollectiveTimeoutError (issue 9 groundwork)."""
    result_file = tmp_path / "result.txt"
    proc = launcher.run(2, [sys.executable, str(PROGRAMS / "check_errors.py")], timeout=60,
                        env={"CHECK_ERRORS_RESULT": str(result_file)})
    # the program ends the job with MPI_Abort, which can beat mpiexec's forwarding of its output: read the file
    text = result_file.read_text() if result_file.exists() else proc.stdout
    lines = [line for line in text.splitlines() if line.startswith("RESULT ")]
    assert lines, f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    result = json.loads(lines[-1][len("RESULT "):])
    assert result["failures"] == 0, result["messages"]
    assert "awaiting rank 1" in result["timeout_message"]
    assert "awaiting rank 1" in result["runner_timeout_message"]


@pytest.mark.parametrize("world_size,runner,check", [
    (2, "1", "metadata"), pytest.param(3, "1", "metadata", marks=pytest.mark.any_mpi), (4, "1", "off"),
    (2, "0", "metadata")])
def test_every_call_matches_mpi(world_size, runner, check, monkeypatch):
    """Every collective x native dtype x op x count x output mode through the plan path (auto, MPI's own, and
    every algorithm for float32/int32) gives MPI's own results bitwise with inputs untouched; cached plans rebind
    new buffers; strided, 2-D and async calls work; bad calls raise before communicating; calls that differ
    between ranks raise CallMismatchError on every rank (on one host the agreement rides on the plan runner's
    waits, or its Python interpreter's with COLLECTIVES_SHM_C=0) and the communicator stays usable; persistent
    calls of every collective give MPI's results run after run and plan again after the plans are dropped. Every dtype
    at 2 and 3 ranks; at 4 ranks (check=off) four dtypes and three counts (`--quick`)."""
    monkeypatch.setenv("COLLECTIVES_SHM_C", runner)
    quick = ["--quick"] if world_size > 3 else []
    result = launch((world_size, [sys.executable, str(PROGRAMS / "check_calls.py"), "--check", check, *quick]),
                    timeout=300)
    assert result["failures"] == 0, result["messages"]
    assert result["cases"] > 2000
    assert result["shared_memory"]
    assert result["native_calls"] > 0
    assert result["mismatches"] == (7 if check != "off" else 1)  # check=off: the runner still compares sizes


@pytest.mark.any_mpi
@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="CPU affinity is Linux-only")
def test_ranks_bound_to_a_core_each_do_not_count_as_sharing_cores():
    """`bind_to="core"` (`mpiexec -bind-to core`, Open MPI's `--bind-to core`) gives each rank one CPU: ranks
    share cores only if the union of their affinities is smaller than their number (each rank's own set of 1 CPU
    once made 2 bound ranks on 2 cores yield the CPU on every poll, as if 4 ranks shared 2 cores)."""
    launcher.skip_unless(bind_to="core")
    result = launch((2, [sys.executable, str(PROGRAMS / "host_layout.py")]), timeout=60, bind_to="core")
    affinities = result["affinities"]
    if any(len(cpus) != 1 for cpus in affinities):
        pytest.skip(f"mpiexec did not bind the ranks to one CPU each here: {affinities}")
    cores = len({cpu for cpus in affinities for cpu in cpus})
    assert result["oversubscribed"] == (cores < 2)
