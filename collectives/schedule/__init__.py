"""The schedule IR: phases of rounds whose peers and chunks are functions of the member index.

See ops.py for the per-end ranges, local steps and round semantics every executor implements, regions.py for
buffer regions and collective.py for each collective's contract.
"""

from .chunks import BlockTable, ChunkTable, split_points
from .collective import ALLTOALL, COLLECTIVES, REDUCING, ROOTED
from .explicit import ExplicitOp, explicit_phase
from .ops import Op, OpKind, Program
from .params import check_chunks
from .phase import Phase, Round, Slot, recv, recv_reduce, send
from .regions import Regions
from .schedule import Schedule

__all__ = [
    "ALLTOALL", "COLLECTIVES", "REDUCING", "ROOTED", "BlockTable", "ChunkTable", "ExplicitOp", "Op", "OpKind",
    "Phase", "Program", "Regions", "Round", "Schedule", "Slot", "check_chunks", "explicit_phase", "recv",
    "recv_reduce", "send", "split_points",
]
