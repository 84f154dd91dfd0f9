"""Shared memory on one host: the arena (windows and control blocks), a rank's plan of a schedule, its lowering
to one instruction stream, and the executor that runs it (C plan runner or its Python interpreter)."""
