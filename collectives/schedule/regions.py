"""Buffer regions: a schedule's own layout of each node's work buffer (MSCCL's input, output and scratch).

By default (`Schedule.regions is None`) a node's work buffer is what the collective's contract says
(`collective.py`): the logical vector, or for alltoall an input region and an output region. A schedule that
needs more declares `Regions`:

* `size`: elements of every node's work buffer (the contract's regions plus scratch);
* `input` / `output`: where the input region and the output region start. None keeps the contract's placement
  (for allreduce, in place: input and output are the logical vector at [0, count)); an integer puts rank r's
  input at [input, input + its input count) (out of place), likewise for the output. Equal integers are an
  in-place layout for collectives whose input and output have the same size (MSCCL's in-place alltoall).

Everything else in [0, size) is scratch: undefined until the schedule writes it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Regions:
    size: int
    input: int | None = None
    output: int | None = None

    def __post_init__(self) -> None:
        for name in ("size", "input", "output"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise ValueError(f"Regions.{name} must be an integer >= 0{' or None' if name != 'size' else ''}, "
                                 f"got {v!r}")

    def describe(self) -> str:
        where = lambda v: "as the contract places it" if v is None else f"at element {v}"  # noqa: E731
        return f"work buffer of {self.size} elements: input {where(self.input)}, output {where(self.output)}"
