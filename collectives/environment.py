"""Every `COLLECTIVES_*` environment variable the library reads: its type, default and meaning, in one table.

Code reads a variable only through `get(name)`, which parses and validates it (a bad value raises ValueError
naming the variable and what would be right). `check_names()` warns once per process about a `COLLECTIVES_*`
variable that is set but unknown (a typo must not be silently ignored); `import collectives` calls it.
docs/environment.md lists the same table (tests/unit/test_environment.py keeps the two in step).
"""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

PREFIX = "COLLECTIVES_"


def _flag(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("expected 1/true/yes/on or 0/false/no/off")


def _seconds_or_none(text: str) -> float | None:
    value = text.strip().lower()
    if value in ("", "none", "0", "inf"):
        return None
    seconds = float(value)
    if not seconds > 0:
        raise ValueError("expected seconds > 0, or 0/none/inf to wait forever")
    return seconds


def _non_negative_int(text: str) -> int:
    value = int(text.strip())
    if value < 0:
        raise ValueError("expected an integer >= 0")
    return value


def _positive_int_or_none(text: str) -> int | None:
    if not text.strip():
        return None
    value = int(text.strip())
    if value < 1:
        raise ValueError("expected an integer >= 1")
    return value


def _text(text: str) -> str:
    return text.strip()


def _choice(*options: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in options:
            raise ValueError(f"expected one of {', '.join(options)}")
        return value
    return parse


@dataclass(frozen=True)
class Variable:
    """One environment variable: `parse(text)` gives its value (raising ValueError on a bad one)."""

    name: str
    kind: str  # what the docs say its type is
    default: Any  # the value when unset (or set to the empty string)
    meaning: str
    parse: Callable[[str], Any]


VARIABLES: dict[str, Variable] = {v.name: v for v in [
    Variable("COLLECTIVES_TIMEOUT", "seconds", 600.0,
             "bound on every blocking wait of a communicator (0/none/inf: wait forever); init(timeout=) overrides",
             _seconds_or_none),
    Variable("COLLECTIVES_CHECK", "metadata, full or off", "metadata",
             "the call agreement: ranks check they issued the same call (metadata), and the same result (full)",
             _choice("metadata", "full", "off")),
    Variable("COLLECTIVES_DETERMINISTIC", "flag", False,
             "reductions use the fixed rank-order algorithm 'direct' (bitwise reproducible); init(deterministic=)",
             _flag),
    Variable("COLLECTIVES_ACCUMULATE", "input or float32", None,
             "float16/bfloat16 reductions carry partial sums in float32 (float32) or the input dtype (input)",
             lambda t: _choice("input", "float32")(t) if t.strip() else None),
    Variable("COLLECTIVES_ALGO", "NCCL_ALGO syntax", "",
             "pin or exclude algorithms for auto: 'ring,direct', '^chain', 'allreduce:ring;broadcast:binomial'",
             _text),
    Variable("COLLECTIVES_DEBUG", "log level", "",
             "INFO logs every choice auto makes and why (logger 'collectives'); WARNING, DEBUG as in logging",
             lambda t: t.strip().upper()),
    Variable("COLLECTIVES_CALIBRATION", "path", "",
             "calibration file of this host read by preset('loopback') and the transport's chooser (default "
             "~/.cache/collectives/loopback.json; written only by `collectives calibrate --default`)",
             _text),
    Variable("COLLECTIVES_DECISIONS", "path", "",
             "measured decisions the transport's auto reads (collectives calibrate --decisions writes them; "
             "default: the package's, measured on the CI machine)", _text),
    Variable("COLLECTIVES_KERNEL_THREADS", "integer", None,
             "threads one reduction kernel call may use (default: this rank's share of the host's cores)",
             _positive_int_or_none),
    Variable("COLLECTIVES_NO_C_KERNELS", "flag", False,
             "do not load the C kernels and plan runner (Numba/numpy kernels, Python executor)", _flag),
    Variable("COLLECTIVES_SHM", "flag", True,
             "run schedules over MPI-3 shared memory when all ranks share a host (0: point-to-point messages)",
             _flag),
    Variable("COLLECTIVES_SHM_C", "flag", True,
             "run shared-memory plans in the C plan runner (0: the Python interpreter of the same program)", _flag),
    Variable("COLLECTIVES_SHM_SINGLE_COPY", "bytes", 16384,
             "shared-memory messages of at least this many bytes that the sender never changes during the call are "
             "read straight from its memory, one copy instead of two (Linux cross-memory attach; 0: never)",
             _non_negative_int),
    Variable("COLLECTIVES_NAP_AFTER_US", "microseconds", 1000,
             "with more ranks than cores, a plan-runner wait that has lasted this long sleeps between polls "
             "(0: never sleeps)", _non_negative_int),
    Variable("COLLECTIVES_ONE_RANK", "flag", False,
             "running as one rank without a launcher is intended: no warning on stderr", _flag),
    Variable("COLLECTIVES_EXIT_ON_FAILURE", "flag", True,
             "after a communicator failed (timeout, dead peer), exit with status 1 instead of MPI_Finalize "
             "(which can block forever on a dead peer)", _flag),
    Variable("COLLECTIVES_ALGORITHM_MODULES", "comma-separated modules", "",
             "modules a switch daemon imports so it knows the application's own registered algorithms",
             _text),
]}


def get(name: str) -> Any:
    """The value of environment variable `name` (its default when unset or empty), parsed and validated."""
    var = VARIABLES.get(name)
    if var is None:
        raise KeyError(f"{name} is not a collectives environment variable (see collectives.environment)")
    text = os.environ.get(name)
    if text is None or not text.strip():
        return var.default
    try:
        return var.parse(text)
    except ValueError as exc:
        raise ValueError(f"{name}={text!r}: {exc} ({var.meaning})") from None


_checked = False


def unknown_names(environ: dict[str, str] | None = None) -> list[tuple[str, str | None]]:
    """(name, closest known name or None) for every COLLECTIVES_* variable set but not known."""
    env = os.environ if environ is None else environ
    out = []
    for name in sorted(env):
        if name.startswith(PREFIX) and name not in VARIABLES:
            close = difflib.get_close_matches(name, list(VARIABLES), n=1, cutoff=0.6)
            out.append((name, close[0] if close else None))
    return out


def check_names() -> None:
    """Warn once per process (on stderr) about COLLECTIVES_* variables that are set but unknown."""
    global _checked
    if _checked:
        return
    _checked = True
    for name, close in unknown_names():
        hint = f"; did you mean {close}?" if close else "; see docs/environment.md for the known ones"
        print(f"collectives: warning: environment variable {name} is not used by collectives{hint}",
              file=sys.stderr)


def table() -> str:
    """The variables as a markdown table (docs/environment.md holds this text)."""
    rows = ["| variable | type | default | meaning |", "|---|---|---|---|"]
    for v in VARIABLES.values():
        default = "unset" if v.default in (None, "") else repr(v.default) if isinstance(v.default, str) \
            else str(v.default)
        rows.append(f"| `{v.name}` | {v.kind} | {default} | {v.meaning} |")
    return "\n".join(rows)


__all__ = ["PREFIX", "VARIABLES", "Variable", "check_names", "get", "table", "unknown_names"]
