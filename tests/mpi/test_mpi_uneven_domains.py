"""Hierarchical allreduces under mpiexec on domains of unequal size and of scattered ranks (issue #23 point 4):
`ranks_per_domain` as a list of domain sizes (3 + 2) and as rank lists (round-robin), each checked against
MPI's own Allreduce (a hierarchical reduce_scatter against Reduce_scatter_block, allgather against Allgather,
hierarchical_alltoall against Alltoall and Alltoallv) by tests/mpi/programs/uneven_domains.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import launcher
import pytest

pytest.importorskip("mpi4py")

PROGRAM = Path(__file__).parent / "programs" / "uneven_domains.py"
TIMEOUT = 150  # seconds per launch (oversubscribed on small machines)


def launch(n: int, domains) -> dict:
    argv = [sys.executable, str(PROGRAM), "--domains", json.dumps(domains)]
    cmd, env = launcher.command(n, argv, timeout=TIMEOUT, env={"COLLECTIVES_TIMEOUT": "60"})
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT + 15, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (
        f"{' '.join(cmd)} exited {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.parametrize("domains,expected", [
    ([3, 2], [[0, 1, 2], [3, 4]]),  # hosts of 3 + 2 ranks
    ([[0, 2, 4], [1, 3]], [[0, 2, 4], [1, 3]]),  # round-robin placement over two hosts
])
def test_hierarchical_allreduce_on_five_ranks_matches_mpi(domains, expected):
    result = launch(5, domains)
    assert result["failures"] == 0, result["messages"]
    assert result["domains"] == expected
    assert result["domain_sizes"] == [3, 2]
    assert result["cases"] == 7 * 3 * 3 + 3 * 2 + 2 * 3 * 2 + 3 * 2 + 1
