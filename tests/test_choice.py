"""transport.choice.choose: the measured thresholds that send a call to MPI's own collective or a schedule."""

from __future__ import annotations

import numpy as np
import pytest

from collectives import algorithms
from collectives.transport import choice


@pytest.fixture
def one_host(monkeypatch):
    """Every rank on this host (schedules over shared memory), the plan runner not involved."""
    monkeypatch.setattr(choice, "shared_memory", lambda world_size=None: True)
    monkeypatch.setattr(choice, "runner_allreduce", lambda world_size: False)


def pick(collective: str, nbytes: int, oversubscribed: bool = False) -> choice.Choice:
    return choice.choose(collective, nbytes, np.dtype(np.float32), 2, algorithms.names(collective),
                         oversubscribed=oversubscribed)


@pytest.mark.parametrize("oversubscribed", [False, True])
def test_reduce_scatter_leaves_mpi_from_192_kib_on_one_host(one_host, oversubscribed):
    """MPICH's reduce_scatter jumps 7x between 128 and 192 KiB here: schedules take over from 192 KiB, below the
    general shared-memory thresholds (512 KiB, 1 MiB) that still hold for allgather."""
    assert pick("reduce_scatter", 128 << 10, oversubscribed).algorithm == "native"
    above = pick("reduce_scatter", 192 << 10, oversubscribed)
    assert above.algorithm == "ring" and "192 KiB" in above.reason
    assert "COLLECTIVES_NATIVE_BELOW_SHM_REDUCE_SCATTER" in pick("reduce_scatter", 64 << 10, oversubscribed).reason
    assert pick("allgather", 192 << 10, oversubscribed).algorithm == "native"


def test_reduce_scatter_over_messages_keeps_the_general_threshold(monkeypatch):
    monkeypatch.setattr(choice, "shared_memory", lambda world_size=None: False)
    assert pick("reduce_scatter", 192 << 10).algorithm == "native"
    assert pick("reduce_scatter", 8 << 20).algorithm != "native"
