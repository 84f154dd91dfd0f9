"""The simulator: time any schedule on any modelled cluster, by events (small) or analytically (any scale).

- model.py: the cost rules both simulators share (message timing, in-network rates, reductions);
- event.py: discrete-event execution of every node's explicit program (FIFO links, data dependencies only);
- analytic.py: round patterns costed vectorized over all members, cached per schedule structure;
- api.py: `simulate(...)` and `sweep(...)`; result.py: `SimulationResult` and nccl-tests' bus factors.

Both simulators follow the same rules (model.py), so they agree where both run (tests/test_simulate.py).
"""

import sys
import types

from .api import EVENT_MAX_MESSAGES, MODES, simulate, sweep
from .result import PhaseTime, SimulationResult, bus_factor

__all__ = ["EVENT_MAX_MESSAGES", "MODES", "PhaseTime", "SimulationResult", "bus_factor", "simulate", "sweep"]


class _CallableModule(types.ModuleType):
    """`collectives.simulate` is this package and, called, `simulate(...)`."""

    def __call__(self, *args, **kwargs) -> SimulationResult:
        return simulate(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
