"""The simulation engine: time a given schedule or registered algorithm on a modelled cluster.

- model.py: the cost rules both simulators share (message timing, in-network rates, reductions, protocols);
- event.py: discrete-event execution of every node's explicit program (links serve earlier rounds first, data
  dependencies and buffer credit only);
- recurrence.py: the per-node start and end rule of a round (rendezvous, or sender-driven within NCCL's credit)
  and its repetition, for the analytic model and the step latency;
- flows.py: a round's messages for all members at once and the link hops they cross (paths cached per topology);
- analytic.py: round patterns costed vectorized over all members, cached per schedule structure;
- latency.py: the unpipelined critical path (protocol step latencies); trace.py: the event run as a Chrome trace;
- engine.py: `run(...)` (one size) and `sweep(...)` (many sizes) for a schedule or an algorithm name;
- result.py: `SimulationResult` and nccl-tests' bus factors.

The engine never resolves "auto": `collectives.simulate` asks `collectives.choice` first. Both simulators follow
the same rules (model.py), so they agree where both run (tests/unit/test_simulate.py).
"""

from .engine import EVENT_MAX_MESSAGES, MODES, run, sweep
from .result import PhaseTime, SimulationResult, bus_factor

__all__ = ["EVENT_MAX_MESSAGES", "MODES", "PhaseTime", "SimulationResult", "bus_factor", "run", "sweep"]
