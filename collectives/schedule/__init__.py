"""The schedule IR: phases of rounds whose peers and chunks are functions of the member index.

See ops.py for the position invariant and the round semantics every executor implements.
"""

from .chunks import ChunkTable, split_points
from .collective import COLLECTIVES, REDUCING, ROOTED
from .ops import Op, OpKind, Program
from .params import check_chunks
from .phase import Phase, Round, Slot, recv, recv_reduce, send
from .schedule import Schedule

__all__ = [
    "COLLECTIVES", "REDUCING", "ROOTED", "ChunkTable", "Op", "OpKind", "Phase", "Program", "Round", "Schedule",
    "Slot", "check_chunks", "recv", "recv_reduce", "send", "split_points",
]
