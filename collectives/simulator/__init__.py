"""The simulation engine: time a given schedule or registered algorithm on a modelled cluster.

- model.py: the cost rules both simulators share (message timing, in-network rates, reductions, protocols);
- event.py: discrete-event execution of every node's explicit program (FIFO links, data dependencies only);
- analytic.py: round patterns costed vectorized over all members, cached per schedule structure;
- engine.py: `run(...)` (one size) and `sweep(...)` (many sizes) for a schedule or an algorithm name;
- result.py: `SimulationResult` and nccl-tests' bus factors.

The engine never resolves "auto": `collectives.simulate` asks `collectives.choice` first. Both simulators follow
the same rules (model.py), so they agree where both run (tests/unit/test_simulate.py).
"""

from .engine import EVENT_MAX_MESSAGES, MODES, run, sweep
from .result import PhaseTime, SimulationResult, bus_factor

__all__ = ["EVENT_MAX_MESSAGES", "MODES", "PhaseTime", "SimulationResult", "bus_factor", "run", "sweep"]
