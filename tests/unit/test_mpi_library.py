"""A missing or mismatched MPI gives an error that says what to install (collectives/transport/mpi_library.py).

The checks are tested on stand-ins for mpi4py's MPI module, and the wiring for real in a fresh interpreter:
`collectives.init()` (the first communicator over MPI loads it) with no loadable libmpi, and as a lone process that a launcher claims to have
started with two others (one MPI singleton init, no launcher).
"""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

MPICH_WHEEL = ("MPICH Version:      5.0.2\nMPICH Release date: Fri Sep 25 20:45:26 UTC 2026\n"
               "MPICH configure:    --with-device=ch4:ucx,ofi --with-pm=hydra:gforker\n")
MPICH_PMIX = MPICH_WHEEL.replace("--with-pm=hydra:gforker", "--with-pm=no --with-pmix=/usr")
OPEN_MPI = "Open MPI v5.0.11, package: Open MPI Distribution, ident: 5.0.11\x00"
PRTERUN = {"PMIX_RANK": "0", "PMIX_NAMESPACE": "prterun-vm-1@1", "OMPI_COMM_WORLD_SIZE": "3"}
HYDRA = {"PMI_RANK": "0", "PMI_SIZE": "3", "PMI_FD": "9"}


@pytest.fixture(scope="module")
def library():
    """collectives.transport.mpi_library (importing it loads MPI here, as test_scratch.py's import does)."""
    try:
        from collectives.transport import mpi_library
    except ImportError as exc:
        pytest.skip(f"no usable MPI here: {exc}")
    return mpi_library


def fake_mpi(version: str, world_size: int = 1):
    return SimpleNamespace(Get_library_version=lambda: version,
                           COMM_WORLD=SimpleNamespace(Get_size=lambda: world_size))


def test_mpich_without_pmix_under_a_pmix_launcher_is_refused_before_mpi_init(library):
    with pytest.raises(library.MPILibraryError, match=r"PMIx launcher.*MPI_Init would abort.*pip uninstall mpich"):
        library.check_before_init(fake_mpi(MPICH_WHEEL), PRTERUN)
    assert issubclass(library.MPILibraryError, ImportError)
    library.check_before_init(fake_mpi(MPICH_PMIX), PRTERUN)  # an MPICH built with PMIx starts there
    library.check_before_init(fake_mpi(MPICH_WHEEL), HYDRA)  # its own launcher
    library.check_before_init(fake_mpi(MPICH_WHEEL), {**PRTERUN, **HYDRA})  # a launcher offering PMI too
    library.check_before_init(fake_mpi(MPICH_WHEEL), {})  # a singleton
    library.check_before_init(fake_mpi(OPEN_MPI), PRTERUN)


def test_a_lone_process_that_the_launcher_counts_as_one_of_several_is_refused(library):
    for env, name in ((HYDRA, "PMI_SIZE=3"), (PRTERUN, "OMPI_COMM_WORLD_SIZE=3")):
        with pytest.raises(library.MPILibraryError, match=rf"alone in MPI_COMM_WORLD.*{name}.*own mpiexec"):
            library.check_world(fake_mpi(OPEN_MPI, 1), env)
    library.check_world(fake_mpi(OPEN_MPI, 3), PRTERUN)  # the launcher's own MPI
    library.check_world(fake_mpi(MPICH_WHEEL, 5), {**HYDRA, "PMI_SIZE": "5"})  # app ranks and switch daemons
    library.check_world(fake_mpi(MPICH_WHEEL, 1), {"PMI_SIZE": "1"})
    library.check_world(fake_mpi(MPICH_WHEEL, 1), {})  # a singleton nobody launched
    library.check_world(fake_mpi(OPEN_MPI, 1), {**HYDRA, "MPI4PY_CHECK_MPIEXEC": "0"})  # mpi4py's switch


def _run(code: str, **env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "OMPI_COMM_WORLD"))}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**clean, **env})


def _init_communicator(**env) -> subprocess.CompletedProcess:
    return _run("import collectives; collectives.init()", **env)


def test_importing_the_transport_loads_no_mpi():
    """The transport also runs on torch's store (no MPI launcher): importing it must not load or initialise MPI,
    so a missing libmpi only matters to a communicator over MPI."""
    # whether torch is installed is asked in the child: in pytest's process tests/ is on sys.path, where
    # tests/torch looks like a namespace package named torch
    proc = _run("import importlib.util, sys, collectives.transport\n"
                "if importlib.util.find_spec('torch') is not None:\n    import collectives.torch\n"
                "print(sorted(m for m in sys.modules if m.startswith('mpi4py.MPI')))",
                MPI4PY_LIBMPI="/nonexistent/libmpi.so")
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stderr


def test_no_mpi_library_says_what_to_install():
    pytest.importorskip("mpi4py")
    proc = _init_communicator(MPI4PY_LIBMPI="/nonexistent/libmpi.so")
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("collectives.transport.errors.MPILibraryError: no MPI library found"), proc.stderr
    assert 'pip install "collectives[mpich]"' in last and "/nonexistent/libmpi.so" in last


def test_a_singleton_whose_launcher_counted_three_fails_at_init():
    """A real MPI_Init without a launcher, told PMI_SIZE=3 (what another MPI's mpiexec sets): init() fails."""
    pytest.importorskip("mpi4py")
    proc = _init_communicator(PMI_SIZE="3")
    last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""
    if "no MPI library found" in last:
        pytest.skip("no MPI library in this environment")
    assert proc.returncode != 0 and "alone in MPI_COMM_WORLD" in last and "PMI_SIZE=3" in last, proc.stderr
