"""Where a received chunk gets reduced: the one place that lands a round's receives in a node's buffer.

The emulator and the MPI transport both call `land_receives`, so a schedule gives bitwise the same result in
one process and under mpiexec. Round semantics (see collectives/schedule/ops.py): writes land at the end of the
round, in program order. A store followed by reduce-receives into the same range, or a run of reduce-receives
into the same range, is ONE fused kernel call: out = local (op) in_1 (op) in_2 ... in program order, so a switch
that reduces 72 children rounds a 16-bit result once, and every node that runs the same ops gets the same bits.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .kernels import reduce_into
from .schedule import Op, OpKind


def land_receives(work: np.ndarray, received: Sequence[tuple[Op, np.ndarray]], op: str) -> None:
    """Apply one round's receives `(op, payload)` (in program order) to `work` with kernel op `op`."""
    i, n = 0, len(received)
    while i < n:
        first, payload = received[i]
        a, b = first.start, first.stop
        j = i + 1
        while j < n and received[j][0].kind == OpKind.RECV_REDUCE and received[j][0].start == a \
                and received[j][0].stop == b:
            j += 1
        inputs = [p for _, p in received[i + 1:j]]
        target = work[a:b]
        if first.kind == OpKind.RECV:
            if inputs:
                reduce_into(target, [payload, *inputs], op)
            else:
                target[...] = payload
        else:
            reduce_into(target, [target, payload, *inputs], op)
        i = j
