"""Sizes in bytes as users write them (nccl-tests: K/M/G suffixes, powers of 1024), sweeps, and readable sizes."""

from __future__ import annotations

_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str | int) -> int:
    """'8' -> 8, '64K' -> 65536, '1.5M' -> 1572864, '1G'/'1GB'/'1GiB' -> 2**30 (nccl-tests' parsesize)."""
    if isinstance(text, int):
        return text
    s = str(text).strip()
    upper = s.upper()
    for tail in ("IB", "B"):
        if len(upper) > len(tail) and upper.endswith(tail) and upper[-len(tail) - 1] in _UNITS:
            upper = upper[:-len(tail)]
            break
    else:
        if upper.endswith("B"):  # plain bytes: '8B'
            upper = upper[:-1]
    mult = 1
    if upper and upper[-1] in _UNITS:
        mult = _UNITS[upper[-1]]
        upper = upper[:-1]
    try:
        value = float(upper)
    except ValueError:
        raise ValueError(f"invalid size {text!r}: a number of bytes with an optional K, M or G suffix") from None
    if value < 0:
        raise ValueError(f"invalid size {text!r}: must be >= 0")
    return int(value * mult)


def sweep(min_bytes: int, max_bytes: int, factor: float | None = 2, increment: int | None = None) -> list[int]:
    """nccl-tests' loop: from min_bytes while <= max_bytes, times factor (or plus increment when given)."""
    if max_bytes < min_bytes:
        raise ValueError(f"max size {max_bytes} is below min size {min_bytes}")
    if increment:
        if increment < 0:
            raise ValueError("the increment (-i) must be positive")
        return list(range(min_bytes, max_bytes + 1, increment))
    if factor is None or factor <= 1:
        raise ValueError(f"the step factor (-f) must be > 1, got {factor}")
    out, size = [], min_bytes
    while size <= max_bytes:
        out.append(size)
        if size == 0:
            size = 1
            continue
        nxt = int(size * factor)
        size = nxt if nxt > size else size + 1
    return out


def human(n: int) -> str:
    for unit, m in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= m and n % m == 0:
            return f"{n // m} {unit}"
    return f"{n} B"


format_size = human
