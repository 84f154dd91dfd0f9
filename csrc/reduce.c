/* Element-wise reduction kernels; see reduce.h for the contract.
 *
 * Vocabulary: the reduction walks the arrays in *blocks* of BLOCK elements. For each block every
 * input is folded, left to right, into an *accumulator* that lives in L1 (a stack array), and the
 * accumulator is stored to `out` once. So an n-input reduction reads n streams and writes one,
 * instead of the 3*(n-1) streams of chained two-operand adds.
 *
 * Exactness rules (the Python tests check them bitwise against numpy):
 *   - float sums/products fold strictly in input order; this file must never be compiled with
 *     -ffast-math or -ffp-contract=fast (no FMA between a product and a later sum exists here, but
 *     reassociation would break the left fold).
 *   - min/max copy numpy.minimum/maximum: if the accumulator is NaN it stays, otherwise a NaN input
 *     wins; on ties (+0.0 vs -0.0) the later input wins. That is exactly x86 (v)maxps(acc, x)
 *     plus a blend that keeps a NaN accumulator, and `(a != a) ? a : (a > b ? a : b)` in C.
 *   - signed integer sums/products run on the unsigned type of the same width (two's-complement
 *     wrap, as numpy does; signed overflow would be undefined behaviour in C).
 *   - 16-bit floats (float16, bfloat16) are widened to float32, folded in float32 across all
 *     inputs, and rounded once to nearest-even.
 *
 * Code paths: every kernel exists twice, a portable version (baseline ISA) and one compiled with
 * __attribute__((target("avx2,f16c"))); coll_init picks one with __builtin_cpu_supports. The
 * portable and AVX2 paths give identical bits (both widen quiet NaN the same way, see h2f).
 * On CPUs that also have avx512f + avx512bw, the all-bfloat16 fast path runs a 16-lane AVX-512
 * variant (same bits; the AVX2 bfloat16 narrow was compute-bound at ~37 GB/s, the AVX-512 one runs at
 * memory speed like float16). Same-type reductions into a separate, large out use streaming stores
 * (see NT_MIN_OUT_BYTES), which saves the read-for-ownership of out.
 */
#include "reduce_internal.h"

typedef void (*native_kernel)(void *out, const void *const *in, size_t n, size_t count, int nt);

/* Non-temporal (streaming) copy of `bytes` from the L1-resident `src` to `dst`, both 64-byte aligned
 * except that the last partial 16 bytes go through memcpy. Streaming stores skip the read-for-ownership
 * of `dst` (a write-allocating store reads each line of out from memory before overwriting it), so a
 * large reduction into a separate out moves one stream less. SSE2 is baseline x86-64. */
static inline void nt_copy(void *dst, const void *src, size_t bytes)
{
#if COLL_X86
    size_t v = bytes & ~(size_t)15;
    for (size_t b = 0; b < v; b += 16)
        _mm_stream_si128((__m128i *)((char *)dst + b), _mm_load_si128((const __m128i *)((const char *)src + b)));
    if (v < bytes)
        memcpy((char *)dst + v, (const char *)src + v, bytes - v);
#else
    memcpy(dst, src, bytes);
#endif
}

static inline void nt_fence(void)
{
#if COLL_X86
    _mm_sfence(); /* order the weakly-ordered streaming stores before we return to the caller */
#endif
}

/* ------------------------------------------------------------------------------------------------
 * Same-type kernels. OPX is an expression in x (the running value) and y (the next input).
 *
 * A *pass* folds G (1..MAXG) inputs into a running value read from `left` (the first input, or the
 * accumulator) and writes it to `dst` (the accumulator, or out on the last pass). With <= MAXG + 1
 * inputs there is a single pass over the whole array: every input is streamed once, side by side,
 * which keeps the hardware prefetchers on all streams. With more inputs the arrays are cut into
 * blocks so the accumulator stays in L1/L2 between passes.
 * ---------------------------------------------------------------------------------------------- */
#define FOLD_IN(J, OPX)                                                                               \
    if (G > J) {                                                                                   \
        y = c##J[i];                                                                               \
        x = (OPX);                                                                                 \
    }

#define DEFINE_KERNEL(NAME, ATTR, T, OPX)                                                          \
    ATTR static inline __attribute__((always_inline)) void NAME##_pass(                            \
        T *dst, const T *left, const void *const *in, size_t s, const size_t G, size_t m)          \
    {                                                                                              \
        const T *c0 = (const T *)in[0] + s;                                                        \
        const T *c1 = (const T *)in[G > 1 ? 1 : 0] + s;                                            \
        const T *c2 = (const T *)in[G > 2 ? 2 : 0] + s;                                            \
        const T *c3 = (const T *)in[G > 3 ? 3 : 0] + s;                                            \
        const T *c4 = (const T *)in[G > 4 ? 4 : 0] + s;                                            \
        const T *c5 = (const T *)in[G > 5 ? 5 : 0] + s;                                            \
        const T *c6 = (const T *)in[G > 6 ? 6 : 0] + s;                                            \
        IVDEP for (size_t i = 0; i < m; i++)                                                       \
        {                                                                                          \
            T x = left[i], y;                                                                      \
            FOLD_IN(0, OPX) FOLD_IN(1, OPX) FOLD_IN(2, OPX) FOLD_IN(3, OPX) FOLD_IN(4, OPX)       \
            FOLD_IN(5, OPX) FOLD_IN(6, OPX)                                                        \
            dst[i] = x;                                                                            \
        }                                                                                          \
    }                                                                                              \
    /* Elements [s, s + m) of the reduction; the final pass writes `res` (out + s, or acc). */       \
    ATTR static inline __attribute__((always_inline)) void NAME##_block(                           \
        T *res, T *acc, const void *const *in, size_t n, size_t s, size_t m)                       \
    {                                                                                              \
        const T *left = (const T *)in[0] + s;                                                      \
        for (size_t k = 1; k < n;) {                                                               \
            size_t g = n - k < MAXG ? n - k : MAXG;                                                \
            T *dst = k + g == n ? res : acc;                                                       \
            switch (g) {                                                                           \
            case 1: NAME##_pass(dst, left, in + k, s, 1, m); break;                                \
            case 2: NAME##_pass(dst, left, in + k, s, 2, m); break;                                \
            case 3: NAME##_pass(dst, left, in + k, s, 3, m); break;                                \
            case 4: NAME##_pass(dst, left, in + k, s, 4, m); break;                                \
            case 5: NAME##_pass(dst, left, in + k, s, 5, m); break;                                \
            case 6: NAME##_pass(dst, left, in + k, s, 6, m); break;                                \
            default: NAME##_pass(dst, left, in + k, s, 7, m); break;                               \
            }                                                                                      \
            left = acc;                                                                            \
            k += g;                                                                                \
        }                                                                                          \
    }                                                                                              \
    /* nt: out overlaps no input and is large, so stream it: each block is reduced into the L1     \
     * accumulator and copied out with streaming stores (after a head with ordinary stores up to  \
     * the first 64-byte boundary of out). Same folds in the same order, so the same bits. */      \
    ATTR static void NAME(void *out_, const void *const *in, size_t n, size_t count, int nt)       \
    {                                                                                              \
        T *out = (T *)out_;                                                                        \
        T acc[BLOCK] __attribute__((aligned(64)));                                                 \
        size_t head = (size_t)(-(uintptr_t)out_ & 63);                                             \
        if (nt && head % sizeof(T) == 0) {                                                         \
            head /= sizeof(T);                                                                     \
            head = head < count ? head : count;                                                    \
            if (head)                                                                              \
                NAME##_block(out, acc, in, n, 0, head);                                            \
            for (size_t s = head; s < count; s += NT_CHUNK / sizeof(T)) {                          \
                size_t m = count - s < NT_CHUNK / sizeof(T) ? count - s : NT_CHUNK / sizeof(T);    \
                NAME##_block(acc, acc, in, n, s, m);                                               \
                nt_copy(out + s, acc, m * sizeof(T));                                              \
            }                                                                                      \
            nt_fence();                                                                            \
            return;                                                                                \
        }                                                                                          \
        size_t block = n <= MAXG + 1 ? count : BLOCK;                                              \
        for (size_t s = 0; s < count; s += block) {                                                \
            size_t m = count - s < block ? count - s : block;                                      \
            NAME##_block(out + s, acc, in, n, s, m);                                               \
        }                                                                                          \
    }

#define F_SUM(T) (x + y)
#define F_PROD(T) (x * y)
#define F_MIN(T) ((x != x) ? x : (x < y ? x : y))
#define F_MAX(T) ((x != x) ? x : (x > y ? x : y))
/* W: an unsigned type at least as wide as int, so u8/u16 products never promote to signed int. */
#define U_SUM(T, W) ((T)((W)x + (W)y))
#define U_PROD(T, W) ((T)((W)x * (W)y))
#define I_MIN (x < y ? x : y)
#define I_MAX (x > y ? x : y)
/* Bitwise ops work on the unsigned type of each width: the same bits for signed and unsigned dtypes. */
#define B_AND (x & y)
#define B_OR (x | y)
#define B_XOR (x ^ y)

#define DEFINE_FLOAT(P, ATTR, SFX, T)                                                              \
    DEFINE_KERNEL(P##_sum_##SFX, ATTR, T, F_SUM(T))                                                \
    DEFINE_KERNEL(P##_prod_##SFX, ATTR, T, F_PROD(T))                                              \
    DEFINE_KERNEL(P##_min_##SFX, ATTR, T, F_MIN(T))                                                \
    DEFINE_KERNEL(P##_max_##SFX, ATTR, T, F_MAX(T))

#define DEFINE_INT(P, ATTR, BITS, W)                                                               \
    DEFINE_KERNEL(P##_sum_u##BITS, ATTR, uint##BITS##_t, U_SUM(uint##BITS##_t, W))                 \
    DEFINE_KERNEL(P##_prod_u##BITS, ATTR, uint##BITS##_t, U_PROD(uint##BITS##_t, W))               \
    DEFINE_KERNEL(P##_min_u##BITS, ATTR, uint##BITS##_t, I_MIN)                                    \
    DEFINE_KERNEL(P##_max_u##BITS, ATTR, uint##BITS##_t, I_MAX)                                    \
    DEFINE_KERNEL(P##_min_i##BITS, ATTR, int##BITS##_t, I_MIN)                                     \
    DEFINE_KERNEL(P##_max_i##BITS, ATTR, int##BITS##_t, I_MAX)                                     \
    DEFINE_KERNEL(P##_band_u##BITS, ATTR, uint##BITS##_t, B_AND)                                   \
    DEFINE_KERNEL(P##_bor_u##BITS, ATTR, uint##BITS##_t, B_OR)                                     \
    DEFINE_KERNEL(P##_bxor_u##BITS, ATTR, uint##BITS##_t, B_XOR)

#define DEFINE_ALL(P, ATTR)                                                                        \
    DEFINE_FLOAT(P, ATTR, f32, float)                                                              \
    DEFINE_FLOAT(P, ATTR, f64, double)                                                             \
    DEFINE_INT(P, ATTR, 8, unsigned int)                                                           \
    DEFINE_INT(P, ATTR, 16, unsigned int)                                                          \
    DEFINE_INT(P, ATTR, 32, uint32_t)                                                              \
    DEFINE_INT(P, ATTR, 64, uint64_t)

/* Table indexed [dtype][op]; signed sum/prod and every bitwise op use the unsigned kernel of the same width.
 * Bitwise ops on floating-point dtypes have no kernel (NULL): coll_reduce refuses them. */
#define INT_ROW(P, S, U) {P##_sum_##U, P##_prod_##U, P##_min_##S, P##_max_##S, P##_band_##U, P##_bor_##U, P##_bxor_##U}
#define TABLE(P)                                                                                   \
    {                                                                                              \
        {P##_sum_f32, P##_prod_f32, P##_min_f32, P##_max_f32, NULL, NULL, NULL},                   \
        {P##_sum_f64, P##_prod_f64, P##_min_f64, P##_max_f64, NULL, NULL, NULL},                   \
        INT_ROW(P, i8, u8), INT_ROW(P, i16, u16), INT_ROW(P, i32, u32), INT_ROW(P, i64, u64),      \
        INT_ROW(P, u8, u8), INT_ROW(P, u16, u16), INT_ROW(P, u32, u32), INT_ROW(P, u64, u64),      \
    }

#define NO_ATTR
DEFINE_ALL(portable, NO_ATTR)
static const native_kernel portable_table[10][COLL_OPS] = TABLE(portable);

#if COLL_X86
DEFINE_ALL(avx2, TARGET_AVX2)
static const native_kernel avx2_table[10][COLL_OPS] = TABLE(avx2);
#endif

/* ------------------------------------------------------------------------------------------------
 * Dispatch
 * ---------------------------------------------------------------------------------------------- */
static int path_state = -1; /* -1: not yet detected, 0: portable, 1: avx2+f16c */
static int avx512_state = -1; /* -1: not yet detected, 0/1: avx512f + avx512bw usable (on top of path 1) */
static int force_portable = 0;

int coll_cpu_path(void)
{
    if (force_portable)
        return 0;
    if (path_state < 0) {
#if COLL_X86
        __builtin_cpu_init();
        path_state = (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c")) ? 1 : 0;
#else
        path_state = 0;
#endif
    }
    return path_state;
}

int coll_cpu_avx512(void)
{
    if (!coll_cpu_path())
        return 0;
    if (avx512_state < 0) {
#if COLL_X86
        avx512_state = (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) ? 1 : 0;
#else
        avx512_state = 0;
#endif
    }
    return avx512_state;
}

void coll_force_portable(int on) { force_portable = on ? 1 : 0; }

static const size_t elem_size[10] = {4, 8, 1, 2, 4, 8, 1, 2, 4, 8};

int coll_reduce(int dtype, int op, void *out, const void *const *inputs, size_t n_inputs, size_t count)
{
    if (dtype < 0 || dtype > COLL_U64 || op < 0 || op >= COLL_OPS || n_inputs < 1)
        return -1;
    if (portable_table[dtype][op] == NULL) /* a bitwise op on a floating-point dtype */
        return -1;
    if (count == 0)
        return 0;
    if (n_inputs == 1) {
        if (out != inputs[0])
            memmove(out, inputs[0], count * elem_size[dtype]);
        return 0;
    }
#if COLL_X86
    if (coll_cpu_path()) {
        /* Stream out when it is a separate array (the contract: out is exactly one input or overlaps
         * none) and the call's working set is beyond a typical L3, so out would leave the caches
         * before anyone reads it anyway. */
        size_t bytes = count * elem_size[dtype];
        int nt = bytes >= NT_MIN_OUT_BYTES && (n_inputs + 1) * bytes >= NT_MIN_TOTAL_BYTES;
        for (size_t k = 0; k < n_inputs && nt; k++)
            nt = inputs[k] != out;
        avx2_table[dtype][op](out, inputs, n_inputs, count, nt);
        return 0;
    }
#endif
    portable_table[dtype][op](out, inputs, n_inputs, count, 0);
    return 0;
}
