"""What the transport assumes of the MPI library, on whichever MPI tests/mpi/launcher.py finds (CI runs the MPI
tests on MPICH and on Open MPI, each from its wheel; Intel MPI's impi-rt wheel by hand, see README): TAG_UB,
point-to-point tags and error classes, COMM_TYPE_SHARED and shared windows, the message path on one host, and
that the job ran on the MPI the launcher belongs to."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import launcher
import pytest

pytest.importorskip("mpi4py")
pytestmark = pytest.mark.any_mpi

PROGRAM = Path(__file__).parent / "programs" / "check_mpi_specifics.py"


@pytest.mark.parametrize("world_size,shm", [(2, "1"), (3, "1"), (3, "0")])
def test_mpi_specific_assumptions(world_size, shm):
    found = launcher.launcher()
    proc = launcher.run(world_size, [sys.executable, str(PROGRAM)], timeout=90, env={"COLLECTIVES_SHM": shm})
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    result = json.loads(lines[-1][len("RESULT "):])
    assert result["failures"] == 0, result["messages"]
    assert result["world_size"] == world_size and result["shared_memory"] == (shm == "1")
    assert launcher.kind_of(result["library"]) is not None, result["library"]
    assert launcher.compatible(found.kind, launcher.kind_of(result["library"])), (result["library"], found)
