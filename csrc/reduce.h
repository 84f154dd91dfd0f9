/* Element-wise reduction kernels: out = in[0] (op) in[1] (op) ... (op) in[n-1], in one pass.
 *
 * The declarations between the CDEF markers are read verbatim by csrc/build_kernels.py as the cffi
 * cdef, so they must stay plain C (no macros, no includes).
 *
 * Invariants the Python caller guarantees (collectives/kernels/_c.py):
 *   - every buffer holds `count` elements of the stated type and is contiguous;
 *   - `out` is either exactly one of the inputs (same start address) or overlaps none of them;
 *   - n_inputs >= 1.
 */
#ifndef COLLECTIVES_REDUCE_H
#define COLLECTIVES_REDUCE_H

#include <stddef.h>

/* CDEF-BEGIN */
enum coll_dtype {
    COLL_F32 = 0, COLL_F64 = 1,
    COLL_I8 = 2, COLL_I16 = 3, COLL_I32 = 4, COLL_I64 = 5,
    COLL_U8 = 6, COLL_U16 = 7, COLL_U32 = 8, COLL_U64 = 9
};
enum coll_half { COLL_HALF_F16 = 0, COLL_HALF_BF16 = 1 };
/* The bitwise ops (BAND, BOR, BXOR) exist for the integer dtypes only; COLL_OPS counts the ops. */
enum coll_op { COLL_SUM = 0, COLL_PROD = 1, COLL_MIN = 2, COLL_MAX = 3, COLL_BAND = 4, COLL_BOR = 5, COLL_BXOR = 6,
               COLL_OPS = 7 };

/* Same-type reduction. Returns 0, or -1 for an unknown dtype/op or a bitwise op on a floating-point dtype. */
int coll_reduce(int dtype, int op, void *out, const void *const *inputs, size_t n_inputs, size_t count);

/* 16-bit float reduction (ops SUM..MAX; bitwise ops return -1) accumulated in float32 and rounded once (round-to-nearest-even).
 * half_kind: COLL_HALF_F16 or COLL_HALF_BF16. out_is_f32 / in_is_f32[k]: that buffer holds float32
 * instead of the 16-bit type (accumulate into float32, or round float32 into 16-bit). */
int coll_reduce_half(int half_kind, int op, void *out, int out_is_f32, const void *const *inputs,
                     const unsigned char *in_is_f32, size_t n_inputs, size_t count);

/* 1 when the AVX2/F16C code path is in use, 0 for the portable scalar path. */
int coll_cpu_path(void);
/* 1 when the AVX2 path also uses its AVX-512 (avx512f + avx512bw) variants, else 0. */
int coll_cpu_avx512(void);
/* Force the portable path (1) or restore CPU detection (0), for tests. */
void coll_force_portable(int on);
/* CDEF-END */

#endif
