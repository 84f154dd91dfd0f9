"""Where a received chunk gets reduced: the one place that lands a round's receives in a node's buffer.

The emulator and the MPI transport both call `land_receives`, so a schedule gives bitwise the same result in
one process and under mpiexec. Round semantics (see collectives/schedule/ops.py): writes land at the end of the
round, in program order. A store followed by reduce-receives into the same range, or a run of reduce-receives
into the same range, is ONE fused kernel call over the operands ordered by source node (the local value
counting as the node's own), so a switch that reduces 72 children rounds a 16-bit result once, and the result
depends only on which nodes contributed, never on arrival order.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .kernels import reduce_into
from .schedule import Op, OpKind


def land_receives(work: np.ndarray, received: Sequence[tuple[Op, np.ndarray]], op: str, node: int,
                  local: np.ndarray | None = None) -> None:
    """Apply one round's receives `(op, payload)` (in program order) to `work`, the buffer of `node`.

    `local`: where the node's current value of every range these receives reduce into lives, when not in
    `work` (the shared-memory executor reads a range the node has not written yet straight from the caller's
    input instead of copying the input into `work` first); the results still land in `work`.

    The operands of one fused reduction are ordered by the node they come from (the local value counts as
    `node`'s), so two partners that reduce each other's data (recursive doubling) compute the same expression
    and get the same bits even where the op is not bitwise commutative (min/max of +0.0 and -0.0, NaN
    payloads).
    """
    i, n = 0, len(received)
    while i < n:
        first, payload = received[i]
        a, b = first.start, first.stop
        j = i + 1
        while j < n and received[j][0].kind == OpKind.RECV_REDUCE and received[j][0].start == a \
                and received[j][0].stop == b:
            j += 1
        target = work[a:b]
        if first.kind == OpKind.RECV and j == i + 1:
            target[...] = payload
        else:
            operands = [(o.peer, p) for o, p in received[i:j]]
            if first.kind == OpKind.RECV_REDUCE:
                operands.append((node, target if local is None else local[a:b]))
            operands.sort(key=lambda item: item[0])  # stable: program order among equal sources
            reduce_into(target, [p for _, p in operands], op)
        i = j
