"""transport.choice.choose: the measured thresholds that send a call to MPI's own collective or a schedule."""

from __future__ import annotations

import numpy as np
import pytest

from collectives import algorithms, registry
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


@pytest.fixture
def runner_host(monkeypatch):
    """Every rank on this host with the shared-memory plan runner (the communicator's runner shortcut)."""
    monkeypatch.setattr(choice, "shared_memory", lambda world_size=None: True)
    monkeypatch.setattr(choice, "runner_allreduce", lambda world_size: True)


@pytest.mark.parametrize("key", sorted(choice.RUNNER_TABLE))
def test_runner_table_rows_cover_every_size_in_order(key):
    rows = choice.RUNNER_TABLE[key]
    bounds = [bound for bound, _, _ in rows]
    assert bounds == sorted(bounds) and len(set(bounds)) == len(bounds) and bounds[-1] == float("inf")
    collective, _ = key
    for _, name, params in rows:
        assert name == "native" or collective in algorithms.info(name).collectives
        assert set(params) <= set(registry.parameters(name)) if name != "native" else not params


@pytest.mark.parametrize("oversubscribed", [False, True])
def test_runner_choices_follow_the_measured_table(runner_host, oversubscribed):
    """With the runner: its schedules for small and mid-size calls (they beat the fastest way to post MPI's own
    from Python), MPI's own for large broadcast and allgather (it copies once, the windows twice), never for
    reduce (MPICH's is 4-20x slower from 512 KiB)."""
    for collective in ("broadcast", "allgather", "reduce_scatter", "reduce"):
        for nbytes in (8, 512, 4 << 10, 64 << 10, 1 << 20):
            got = pick(collective, nbytes, oversubscribed)
            assert got.algorithm in algorithms.names(collective) and "run in C" in got.reason, (collective, got)
        nbytes = 16 << 20
        large = pick(collective, nbytes, oversubscribed)
        assert (large.algorithm == "native") == (collective != "reduce"), (collective, large)
        if large.algorithm == "native":
            assert "plan runner" in large.reason and f"{nbytes} B" in large.reason
    reduces = [pick("reduce", n, oversubscribed).algorithm for n in range(8, 1 << 30, 1 << 24)]
    assert "native" not in reduces
    # MPICH's reduce_scatter falls off a cliff at 64 MiB with 2 ranks: the ring again
    assert pick("reduce_scatter", 64 << 20, False).algorithm == "ring"


@pytest.mark.parametrize("collective", ["broadcast", "allgather", "reduce_scatter", "reduce"])
def test_runner_choices_never_give_bfloat16_to_mpi(runner_host, collective):
    """MPI has no bfloat16: where the table says native, the nearest row's schedule runs instead."""
    for oversubscribed in (False, True):
        for nbytes in (8, 4 << 10, 1 << 20, 64 << 20, 1 << 30):
            got = choice.choose(collective, nbytes, np.dtype("bfloat16"), 2, algorithms.names(collective),
                                oversubscribed=oversubscribed)
            assert got.algorithm in algorithms.names(collective), (nbytes, got)
