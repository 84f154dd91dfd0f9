"""cffi build script (API mode, out of line) for the C reduction kernels and the shared-memory plan runner
(csrc/plan.c): collectives._ckernels.

setup.py names ``csrc/build_kernels.py:ffibuilder``; running this file directly builds the
extension in place (``python csrc/build_kernels.py``) for quick iteration.

No -march=native and no -ffast-math: the module must load on any x86-64 (AVX2/F16C code is chosen at
run time inside reduce.c) and float folds must keep numpy's left-to-right rounding.
"""

import os
import sys

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))


HEADERS = ("reduce.h", "plan.h")


def _cdef_from_headers() -> str:
    parts = []
    for name in HEADERS:
        with open(os.path.join(HERE, name), encoding="utf-8") as f:
            text = f.read()
        start = text.index("/* CDEF-BEGIN */") + len("/* CDEF-BEGIN */")
        parts.append(text[start : text.index("/* CDEF-END */")])
    return "\n".join(parts)


def _compile_args() -> list[str]:
    if sys.platform == "win32":
        return ["/O2"]
    return ["-O3", "-fno-fast-math", "-ffp-contract=off", "-std=gnu11"]


ffibuilder = FFI()
ffibuilder.cdef(_cdef_from_headers())
ffibuilder.set_source(
    "collectives._ckernels",
    '#include "reduce.h"\n#include "plan.h"',
    # Paths relative to the project root: setuptools wants relative source paths and runs there.
    sources=["csrc/reduce.c", "csrc/reduce_half.c", "csrc/plan.c"],
    include_dirs=["csrc"],
    extra_compile_args=_compile_args(),
)

if __name__ == "__main__":
    os.chdir(os.path.dirname(HERE))
    ffibuilder.compile(verbose=True)
