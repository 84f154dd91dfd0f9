/* What the reduction kernels' two files share (reduce.c: same-type kernels and dispatch; reduce_half.c:
 * 16-bit float kernels): the target attributes and the blocking constants. Not part of the contract. */
#ifndef COLL_REDUCE_INTERNAL_H
#define COLL_REDUCE_INTERNAL_H

#include "reduce.h"

#include <stdint.h>
#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define COLL_X86 1
#include <immintrin.h>
#define TARGET_AVX2 __attribute__((target("avx2,f16c")))
#else
#define COLL_X86 0
#endif

/* Tell the vectoriser that out[i] = f(a[i], b[i]) carries no dependence between iterations even
 * though `out` may be the very same array as an input (which the contract allows). */
#if defined(__clang__)
#define IVDEP _Pragma("clang loop vectorize(assume_safety)")
#elif defined(__GNUC__)
#define IVDEP _Pragma("GCC ivdep")
#else
#define IVDEP
#endif

#define BLOCK 4096 /* elements per block when there are more than MAXG + 1 inputs */
#define MAXG 7     /* inputs folded per pass: up to 8 read streams and 1 write stream in flight */
#define NT_MIN_OUT_BYTES ((size_t)4 << 20)    /* streaming stores for out from 4 MiB ...            */
#define NT_MIN_TOTAL_BYTES ((size_t)32 << 20) /* ... when inputs + out exceed 32 MiB (a typical L3) */
/* Bytes per streamed chunk: small, so the input reads of the next chunk overlap the streaming stores
 * of this one (16 KiB chunks measured ~20% slower than 512 B - 2 KiB on a 2-input sum). */
#define NT_CHUNK 512

#endif
