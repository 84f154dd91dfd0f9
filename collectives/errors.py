"""Exceptions raised by collectives."""


class CollectivesError(Exception):
    """Base class of the library's own errors."""


class ScheduleError(CollectivesError):
    """A schedule is wrong: a double or missing contribution, an unmatched message, a deadlock.

    Attributes name where: `node`, `op_index` (index in that node's program), `round`, `elements` (start, stop).
    """

    def __init__(self, message: str, *, node: int | None = None, op_index: int | None = None,
                 round: int | None = None, elements: tuple[int, int] | None = None) -> None:
        super().__init__(message)
        self.node = node
        self.op_index = op_index
        self.round = round
        self.elements = elements
