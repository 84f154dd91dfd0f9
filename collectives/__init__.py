"""collectives: collective communication for Python.

Every algorithm is written once, as a schedule (collectives.algorithms); the verifier proves it, the emulator
runs it over numpy buffers, the simulator times it on modelled clusters and the MPI transport runs it for real.
Importing this package never initialises MPI.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .errors import (
    CallMismatchError,
    CollectivesError,
    CollectiveTimeoutError,
    CommunicatorClosedError,
    PeerFailedError,
    ScheduleError,
)

__version__ = "0.1.0"

from . import environment as _environment  # noqa: E402

_environment.check_names()  # a misspelt COLLECTIVES_* variable is reported, not ignored

# Public names resolved on first use, so `import collectives` stays cheap (no numba, no MPI).
_LAZY = {
    "verify": ("collectives.verifier", "verify"),
    "VerifyReport": ("collectives.verifier", "VerifyReport"),
    "emulate": ("collectives.emulator", "emulate"),
    "algorithms": ("collectives.algorithms", None),
    "kernels": ("collectives.kernels", None),
    "schedule": ("collectives.schedule", None),
    "topology": ("collectives.topology", None),
    # modules that are themselves callable: collectives.simulate(...), collectives.tune(...)
    "simulate": ("collectives.simulate", None),
    "tune": ("collectives.tune", None),
    "init": ("collectives.transport", "init"),
    "Communicator": ("collectives.transport", "Communicator"),
    "PersistentCall": ("collectives.transport", "PersistentCall"),
}


def __getattr__(name: str):
    if name in _LAZY:
        module, attr = _LAZY[name]
        mod = importlib.import_module(module)
        value = mod if attr is None else getattr(mod, attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'collectives' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_LAZY))


if TYPE_CHECKING:  # pragma: no cover
    from . import algorithms, kernels, schedule, topology  # noqa: F401
    from .emulator import emulate  # noqa: F401
    from .transport import Communicator, PersistentCall, init  # noqa: F401
    from .verifier import VerifyReport, verify  # noqa: F401

__all__ = ["CallMismatchError", "CollectiveTimeoutError", "CollectivesError", "CommunicatorClosedError",
           "PeerFailedError", "ScheduleError", "__version__", *_LAZY]
