"""Test layers: tests/unit needs no MPI launcher; tests/mpi launches `mpiexec`; tests/torch needs PyTorch too.

Every test under tests/mpi and tests/torch is marked `mpi` (and `torch`), so `pytest -m "not mpi"` runs the
quick, launcher-free part of the suite.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        layer = Path(str(item.fspath)).relative_to(HERE).parts[0]
        if layer in ("mpi", "torch"):
            item.add_marker(pytest.mark.mpi)
        if layer == "torch":
            item.add_marker(pytest.mark.torch)
