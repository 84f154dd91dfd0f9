"""Backend "collectives" without mpiexec: started by torchrun and by torch.multiprocessing.spawn, on torch's store
(collectives.torch.runtime.StoreRuntime: shared memory on the host, gloo for the rest).

Every launch runs under a time limit in a session of its own (a hang fails the test and leaves no process behind)
with no MPI launcher's environment:

* the transport's own checks under torchrun: every collective through the plan path (check_calls.py --runtime
  store --quick) with the host's shared memory and with COLLECTIVES_SHM=0 (messages over gloo), and point-to-point
  (check_p2p.py --runtime store);
* the backend's check program (programs/check_torch.py) and DDP (examples/ddp_train.py) under torchrun, DDP's
  weights compared with gloo's;
* torch.multiprocessing.spawn with init_method file:// (programs/check_spawn.py);
* mpi4py.MPI is never imported on this path (check_torch.py and check_spawn.py report it per rank);
* bad setups raise clear errors (programs/check_setups.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install 'collectives[torch]')")
pytest.importorskip("torch.distributed", reason="this PyTorch build has no torch.distributed")

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = Path(__file__).parent / "programs"
MPI_PROGRAMS = ROOT / "tests" / "mpi" / "programs"
TORCHRUN = Path(sys.executable).parent / "torchrun"
TIMEOUT = 120  # seconds per launch (2 cores, several ranks importing torch; measured 10-35 s on a loaded VM)

needs_torchrun = pytest.mark.skipif(not TORCHRUN.exists(), reason=f"no torchrun next to {sys.executable}")


def _environment(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "MV2_", "HYDRA_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", COLLECTIVES_TIMEOUT="60", **extra)
    return env


def run(cmd: list[str], timeout: float = TIMEOUT, **env: str) -> dict:
    """Run `cmd` in a session of its own and return the last `RESULT {json}` line; a launch still running after
    `timeout` seconds is killed with everything it started, and fails the test."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env=_environment(**env), start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} did not finish within {timeout} s (a hang)\nstdout:\n{stdout[-3000:]}\n"
                    f"stderr:\n{stderr[-3000:]}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # workers a failed launcher left behind
        except ProcessLookupError:
            pass
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (
        f"{' '.join(cmd)} exited {proc.returncode}\nstdout:\n{stdout[-3000:]}\nstderr:\n{stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def torchrun(n: int, program: Path, *args: str, **env: str) -> dict:
    # --standalone: a rendezvous on a free port of its own (tests may run side by side)
    return run([str(TORCHRUN), "--standalone", "--nproc_per_node", str(n), str(program), *args], **env)


STORE = "torch's store and gloo"


@needs_torchrun
@pytest.mark.parametrize("shm", ["1", "0"], ids=["shared-memory", "gloo-messages"])
def test_check_calls_under_torchrun(shm):
    result = torchrun(2, MPI_PROGRAMS / "check_calls.py", "--runtime", "store", "--quick", COLLECTIVES_SHM=shm)
    assert result["failures"] == 0, "\n".join(result["messages"])
    assert result["cases"] > 2000 and result["mismatches"] >= 5
    assert result["shared_memory"] is (shm == "1")


@needs_torchrun
def test_point_to_point_under_torchrun():
    result = torchrun(3, MPI_PROGRAMS / "check_p2p.py", "--runtime", "store")
    assert result["failures"] == 0, "\n".join(result["messages"])
    assert result["cases"] >= 20


@needs_torchrun
def test_backend_checks_under_torchrun():
    result = torchrun(3, PROGRAMS / "check_torch.py")
    assert result["failures"] == 0, "\n".join(result["messages"])
    assert result["cases"] > 500 and result["size"] == 3
    assert result["runtime"].startswith(STORE)
    assert result["mpi_imported"] == [], f"ranks {result['mpi_imported']} imported mpi4py.MPI"


@needs_torchrun
def test_ddp_under_torchrun_matches_gloo(tmp_path):
    """On 2 ranks every gradient element is the sum of two values, the same in any order: the weights are bitwise
    gloo's (measured: identical)."""
    weights = {}
    for backend in ("collectives", "gloo"):
        out = tmp_path / backend
        result = torchrun(2, ROOT / "examples" / "ddp_train.py", "--backend", backend, "--out", str(out),
                          "--steps", "30")
        assert result["world_size"] == 2 and result["steps"] == 30
        ranks = [torch.load(out / f"weights_rank{r}.pt") for r in range(2)]
        for name, w in ranks[0].items():
            assert torch.equal(ranks[1][name], w), f"{backend}: rank 1's {name} differs from rank 0's"
        weights[backend] = ranks[0]
    assert weights["collectives"].keys() == weights["gloo"].keys()
    for name, w in weights["gloo"].items():
        assert torch.equal(weights["collectives"][name], w), name


def test_torch_multiprocessing_spawn_with_a_file_rendezvous():
    result = run([sys.executable, str(PROGRAMS / "check_spawn.py"), "--nprocs", "2"])
    assert result["failures"] == 0, "\n".join(result["messages"])
    assert result["cases"] >= 15
    assert result["runtime"].startswith(STORE) and result["shared_memory"] == [True, True]
    assert result["mpi_imported"] == [], f"ranks {result['mpi_imported']} imported mpi4py.MPI"


def test_bad_setups_raise_clear_errors():
    result = run([sys.executable, str(PROGRAMS / "check_setups.py")], timeout=60)
    assert result["failures"] == [], "\n".join(result["failures"])
    assert len(result["checks"]) == 4
