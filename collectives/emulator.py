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
from .schedule import Op, OpKind, Schedule
from .schedule.collective import REDUCING
from .schedule.expand import expand

_SEND = int(OpKind.SEND)
_KINDS = {int(k): k for k in OpKind}


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

    # expand's table (kept for the next executor) in (round, node, program order): rows are node-major in
    # program order and each program is sorted by round, so a stable sort by round gives that order
    t = expand(schedule)
    rows = np.argsort(t.round, kind="stable")
    rounds, nodes, kinds = t.round[rows].tolist(), t.node[rows].tolist(), t.kind[rows].tolist()
    peers, starts, stops, remotes = (c[rows].tolist() for c in (t.peer, t.start, t.stop, t.remote))
    bounds = [0, *(np.flatnonzero(np.diff(t.round[rows])) + 1).tolist(), len(rows)]
    in_flight: dict[tuple[int, int], deque] = defaultdict(deque)  # (src, dst) -> payloads in send order
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        for i in range(lo, hi):  # sends read the state as the round begins
            if kinds[i] == _SEND:
                node = nodes[i]
                in_flight[(node, peers[i])].append(work[node][starts[i]:stops[i]].copy())
        received: list[tuple[Op, np.ndarray]] = []
        for i in range(lo, hi):  # each node's receives land together, in program order
            if kinds[i] != _SEND:
                node, peer = nodes[i], peers[i]
                queue = in_flight[(peer, node)]
                if not queue:
                    raise RuntimeError(f"node {node} receives from node {peer} in round {rounds[i]} but nothing "
                                       "was sent; run collectives.verify(schedule) to locate the fault")
                message = Op(rounds[i], _KINDS[kinds[i]], peer, starts[i], stops[i], remotes[i])
                received.append((message, queue.popleft()))
            if received and (i + 1 == hi or nodes[i + 1] != nodes[i]):
                land_receives(work[nodes[i]], received, kernel_op, nodes[i])
                received = []
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
