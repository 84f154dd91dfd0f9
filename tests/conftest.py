"""Test layers: tests/unit needs no MPI launcher; tests/mpi launches `mpiexec`; tests/torch needs PyTorch too.

Every test under tests/mpi and tests/torch is marked `mpi` (and `torch`), so `pytest -m "not mpi"` runs the
quick, launcher-free part of the suite. tests/mpi/launcher.py builds every `mpiexec` command line for the MPI
found (MPICH, Open MPI, Intel MPI); its folder is put on sys.path so tests/mpi and tests/torch both
`import launcher`.

Tests marked `any_mpi` check what differs between MPI libraries and launchers (attributes, error classes,
shared windows, MPI's own collectives, MPMD syntax, launcher flags, exit statuses, MPI_Abort):
`pytest tests/mpi -m any_mpi` is a short check of another MPI (CI runs all of tests/mpi on MPICH and on Open
MPI, .ci/run).

Under the quick part's expression, `-m "not mpi"`, tests/mpi and tests/torch are not even collected: none of
their tests could run, and importing them costs the quick part every time (tests/torch imports torch, ~1.5 s).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "mpi"))


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "any_mpi: checks what differs between MPIs: a short check of another MPI")


def _excludes_every_mpi_test(markexpr: str) -> bool:
    """True for the quick part's own expression, `-m "not mpi"` (spacing aside): every test of tests/mpi and
    tests/torch is marked mpi, so none of them could run. Any other expression collects everything and lets
    pytest decide test by test."""
    return " ".join(markexpr.split()) == "not mpi"


def pytest_ignore_collect(collection_path, config) -> bool | None:
    if collection_path.parent == HERE and collection_path.name in ("mpi", "torch") \
            and _excludes_every_mpi_test(config.getoption("markexpr")):
        return True
    return None


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        layer = Path(str(item.fspath)).relative_to(HERE).parts[0]
        if layer in ("mpi", "torch"):
            item.add_marker(pytest.mark.mpi)
        if layer == "torch":
            item.add_marker(pytest.mark.torch)
