"""Test layers: tests/unit needs no MPI launcher; tests/mpi launches `mpiexec`; tests/torch needs PyTorch too.

Every test under tests/mpi and tests/torch is marked `mpi` (and `torch`), so `pytest -m "not mpi"` runs the
quick, launcher-free part of the suite. tests/mpi/launcher.py builds every `mpiexec` command line for the MPI
found (MPICH, Open MPI, Intel MPI); its folder is put on sys.path so tests/mpi and tests/torch both
`import launcher`.

Tests marked `any_mpi` check what differs between MPI libraries and launchers (attributes, error classes,
shared windows, MPI's own collectives, MPMD syntax, launcher flags, exit statuses, MPI_Abort):
`pytest tests/mpi -m any_mpi` is a short check of another MPI (CI runs all of tests/mpi on MPICH and on Open
MPI, .ci/run).

When the `-m` expression is false for every test marked `mpi`, whatever other marks it carries (`-m "not mpi"`),
tests/mpi and tests/torch are not even collected: none of their tests could run, and importing them costs the
quick part every time (tests/torch imports torch, ~1.5 s).
"""

from __future__ import annotations

import functools
import itertools
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "mpi"))


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "any_mpi: checks what differs between MPIs: a short check of another MPI")


@functools.cache
def _excludes_every_mpi_test(markexpr: str) -> bool:
    """True when the `-m` expression is false for a test marked `mpi` under every choice of its other marks."""
    if not markexpr:
        return False
    from _pytest.mark.expression import Expression  # pytest's own parser of -m

    expr = Expression.compile(markexpr)
    names: set[str] = set()
    while True:  # the names an evaluation looks at can depend on the others (and/or short-circuit)
        others = sorted(names - {"mpi"})
        if len(others) > 10:
            return False
        known = set(names)
        for values in itertools.product((False, True), repeat=len(others)):
            given = dict(zip(others, values, strict=True))

            def matcher(name: str, given: dict = given, /, **kwargs) -> bool:
                names.add(name if not kwargs else "")  # a mark's arguments: too fine to reason about here
                return name == "mpi" or given.get(name, False)
            if expr.evaluate(matcher):
                return False
        if "" in names:
            return False
        if names == known:
            return True


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
