"""The emulator: run any schedule in one process over numpy buffers, switches included.

Every node (rank or switch) gets a work buffer of `schedule.work_size` elements; each rank's input is placed at
`schedule.input_range(rank)` and its output read from `schedule.output_range(rank)` (the contract's regions or
the schedule's own). The emulator walks the global rounds, captures each send's elements as the round begins
(a node's messages to itself included: local copies and reductions), then lands the receives through
`collectives.execution.land_receives`, the same code the MPI transport uses. Switch nodes reduce with the
same kernels: that is the in-network reduction emulation.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Sequence

import numpy as np

from .execution import land_receives
from .kernels import SUPPORTED_DTYPES, round_into
from .kernels._dtypes import HALF_CODES
from .reduction import check_op, finalize
from .schedule import OpKind, Schedule
from .schedule.collective import REDUCING
from .schedule.expand import node_programs


def _check_inputs(schedule: Schedule, inputs: Sequence[np.ndarray]) -> np.dtype:
    p = schedule.world_size
    if len(inputs) != p:
        raise ValueError(f"emulate needs one input array per rank: world_size={p}, got {len(inputs)} inputs")
    dtype = np.asarray(inputs[0]).dtype
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"unsupported dtype {dtype}; supported: {', '.join(str(d) for d in SUPPORTED_DTYPES)}")
    for r, x in enumerate(inputs):
        x = np.asarray(x)
        if x.dtype != dtype:
            raise TypeError(f"rank {r}'s input has dtype {x.dtype}, rank 0's has {dtype}: all ranks must agree")
        want = schedule.input_count(r)
        if x.size != want:
            what = (f"row {r} of its counts matrix sums to {want}" if schedule.collective == "alltoallv" else
                    f"count={schedule.count} (each rank's input element count)")
            raise ValueError(f"rank {r}'s input has {x.size} elements; this schedule was built for {what}")
    return dtype


ACCUMULATE = (None, "input", "float32")


def check_accumulate(accumulate: str | None) -> str | None:
    """Validate an `accumulate=` value: None or "input" (partial sums in the input dtype) or "float32"."""
    if accumulate not in ACCUMULATE:
        raise ValueError(f"accumulate must be one of None, 'input', 'float32', got {accumulate!r}")
    return accumulate


def widens(accumulate: str | None, dtype: np.dtype, collective: str) -> bool:
    """True when `accumulate` makes a 16-bit float reduction run on float32 work buffers."""
    return check_accumulate(accumulate) == "float32" and np.dtype(dtype) in HALF_CODES and collective in REDUCING


def emulate(schedule: Schedule, inputs: Sequence[np.ndarray], op: str = "sum", *,
            accumulate: str | None = None) -> list[np.ndarray | None]:
    """Run `schedule` over `inputs` (one array per rank) and return each rank's output (None: no output).

    `op` is one of sum, prod, min, max, avg (avg: sum, then divide once by the world size).
    `accumulate="float32"` (float16/bfloat16 reductions only; a no-op otherwise): every work buffer, message
    and reduction is float32 (inputs converted once when placed), and each output is rounded to the input
    dtype once at the end. The default (None or "input") rounds to the input dtype at every reduction.
    """
    dtype = _check_inputs(schedule, inputs)
    kernel_op = check_op(op, dtype) if schedule.collective in REDUCING else "sum"
    wide = widens(accumulate, dtype, schedule.collective)
    work_dtype = np.dtype(np.float32) if wide else dtype
    n, p = schedule.num_nodes, schedule.world_size
    work = [np.zeros(schedule.work_size, dtype=work_dtype) for _ in range(n)]
    for r in range(p):
        rng = schedule.input_range(r)
        if rng is not None:
            work[r][rng[0]:rng[1]] = np.asarray(inputs[r]).reshape(-1).astype(work_dtype)

    by_round: dict[int, list[tuple[int, list]]] = defaultdict(list)
    for node, program in enumerate(node_programs(schedule)):  # expand's table, kept for the next executor
        for rnd, ops in program.rounds():
            by_round[rnd].append((node, ops))
    in_flight: dict[tuple[int, int], deque] = defaultdict(deque)  # (src, dst) -> payloads in send order
    for rnd in sorted(by_round):
        entries = by_round[rnd]
        for node, ops in entries:  # sends read the state as the round begins
            for _, o in ops:
                if o.kind == OpKind.SEND:
                    in_flight[(node, o.peer)].append(work[node][o.start:o.stop].copy())
        for node, ops in entries:
            received = []
            for _, o in ops:
                if o.kind != OpKind.SEND:
                    queue = in_flight[(o.peer, node)]
                    if not queue:
                        raise RuntimeError(f"node {node} receives from node {o.peer} in round {rnd} but nothing "
                                           "was sent; run collectives.verify(schedule) to locate the fault")
                    received.append((o, queue.popleft()))
            land_receives(work[node], received, kernel_op, node)
    outputs: list[np.ndarray | None] = []
    for r in range(p):
        rng = schedule.output_range(r)
        if rng is None:
            outputs.append(None)
            continue
        out = work[r][rng[0]:rng[1]].copy()
        if schedule.collective in REDUCING:
            finalize(out, op, p)
        if wide:  # round once, at the end
            out = round_into(np.empty(out.shape, dtype=dtype), out)
        outputs.append(out)
    return outputs


__all__ = ["emulate"]
