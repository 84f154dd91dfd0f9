/* 16-bit float (float16, bfloat16) reduction kernels; see reduce.h for the contract and reduce.c for the
 * exactness rules and code paths they share: inputs (16-bit or float32, per input) are widened to float32,
 * folded in float32 in input order, and rounded once to nearest-even (or kept in float32). */
#include "reduce_internal.h"

/* ------------------------------------------------------------------------------------------------
 * 16-bit float <-> float32, portable scalar versions. Bit-identical to the F16C/AVX2 versions:
 * widening a float16 NaN sets the quiet bit (as vcvtph2ps does); narrowing keeps the top payload
 * bits and sets the quiet bit (as vcvtps2ph does); bfloat16 widening is a plain shift.
 * ---------------------------------------------------------------------------------------------- */
static inline float bits_to_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint32_t f32_to_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float h2f(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f)
        return bits_to_f32(sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0u));
    if (exp == 0) {
        if (man == 0)
            return bits_to_f32(sign);
        uint32_t e = 113; /* subnormal: normalise the mantissa */
        while (!(man & 0x400u)) {
            man <<= 1;
            e--;
        }
        return bits_to_f32(sign | (e << 23) | ((man & 0x3ffu) << 13));
    }
    return bits_to_f32(sign | ((exp + 112) << 23) | (man << 13));
}

static inline uint16_t f2h(float f)
{
    uint32_t x = f32_to_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) /* NaN: quiet, keep the top 9 payload bits */
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    if (ax >= 0x477ff000u) /* >= 65520 rounds to infinity (and inf stays inf) */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) { /* below 2^-14: float16 subnormal or zero */
        uint32_t e = ax >> 23;
        if (e < 102)
            return sign;
        uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* 14..24 */
        uint32_t r = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1u)))
            r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = (ax - 0x38000000u) >> 13;
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u)))
        r++;
    return (uint16_t)(sign | r);
}

static inline float b2f(uint16_t b) { return bits_to_f32((uint32_t)b << 16); }

static inline uint16_t f2b(float f)
{
    uint32_t x = f32_to_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* ------------------------------------------------------------------------------------------------
 * 16-bit kernels, portable path: widen each input block into `tmp`, fold it into `acc`.
 * ---------------------------------------------------------------------------------------------- */
static void fold_f32(int op, float *restrict acc, const float *restrict y, size_t m)
{
    switch (op) {
    case COLL_SUM:
        for (size_t i = 0; i < m; i++)
            acc[i] = acc[i] + y[i];
        break;
    case COLL_PROD:
        for (size_t i = 0; i < m; i++)
            acc[i] = acc[i] * y[i];
        break;
    case COLL_MIN:
        for (size_t i = 0; i < m; i++) {
            float x = acc[i], v = y[i];
            acc[i] = (x != x) ? x : (x < v ? x : v);
        }
        break;
    default:
        for (size_t i = 0; i < m; i++) {
            float x = acc[i], v = y[i];
            acc[i] = (x != x) ? x : (x > v ? x : v);
        }
        break;
    }
}

static void widen_portable(int kind, float *restrict dst, const uint16_t *restrict src, size_t m)
{
    if (kind == COLL_HALF_BF16)
        for (size_t i = 0; i < m; i++)
            dst[i] = b2f(src[i]);
    else
        for (size_t i = 0; i < m; i++)
            dst[i] = h2f(src[i]);
}

static void narrow_portable(int kind, uint16_t *restrict dst, const float *restrict src, size_t m)
{
    if (kind == COLL_HALF_BF16)
        for (size_t i = 0; i < m; i++)
            dst[i] = f2b(src[i]);
    else
        for (size_t i = 0; i < m; i++)
            dst[i] = f2h(src[i]);
}

static void half_portable(int kind, int op, void *out, int out_f32, const void *const *in,
                          const unsigned char *in_f32, size_t n, size_t count)
{
    float acc[BLOCK], tmp[BLOCK];
    for (size_t s = 0; s < count; s += BLOCK) {
        size_t m = count - s < BLOCK ? count - s : BLOCK;
        if (in_f32[0])
            memcpy(acc, (const float *)in[0] + s, m * sizeof(float));
        else
            widen_portable(kind, acc, (const uint16_t *)in[0] + s, m);
        for (size_t k = 1; k < n; k++) {
            const float *y = tmp;
            if (in_f32[k])
                y = (const float *)in[k] + s;
            else
                widen_portable(kind, tmp, (const uint16_t *)in[k] + s, m);
            fold_f32(op, acc, y, m);
        }
        if (out_f32)
            memcpy((float *)out + s, acc, m * sizeof(float));
        else
            narrow_portable(kind, (uint16_t *)out + s, acc, m);
    }
}

/* ------------------------------------------------------------------------------------------------
 * 16-bit kernels, AVX2 + F16C path: 8 lanes at a time, conversions fused into the fold.
 * A block's ragged tail goes through an 8-element zero-padded buffer, so every element sees the
 * same vector instructions.
 * ---------------------------------------------------------------------------------------------- */
#if COLL_X86
TARGET_AVX2 static inline __m256 ld_f16(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

TARGET_AVX2 static inline __m256 ld_bf16(const uint16_t *p)
{
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

TARGET_AVX2 static inline void st_f16(uint16_t *p, __m256 v)
{
    _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

TARGET_AVX2 static inline void st_bf16(uint16_t *p, __m256 v)
{
    __m256i x = _mm256_castps_si256(v);
    __m256i hi = _mm256_srli_epi32(x, 16);
    __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    __m256i rounded = _mm256_add_epi32(x, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    __m256i r = _mm256_srli_epi32(rounded, 16);
    __m256i quiet = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
    __m256i isnan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, quiet, isnan);
    /* pack 8 x u32 (each <= 0xffff) into 8 x u16; packus works per 128-bit lane, so fix order */
    __m256i packed = _mm256_packus_epi32(r, r);
    packed = _mm256_permute4x64_epi64(packed, 0x08);
    _mm_storeu_si128((__m128i *)p, _mm256_castsi256_si128(packed));
}

TARGET_AVX2 static inline __m256 v_sum(__m256 a, __m256 b) { return _mm256_add_ps(a, b); }
TARGET_AVX2 static inline __m256 v_prod(__m256 a, __m256 b) { return _mm256_mul_ps(a, b); }
/* (v)minps/(v)maxps return the second operand when either is NaN or on ties; the blend then
 * keeps a NaN accumulator: together exactly numpy.minimum/maximum(acc, x). */
TARGET_AVX2 static inline __m256 v_min(__m256 a, __m256 b)
{
    return _mm256_blendv_ps(_mm256_min_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
}
TARGET_AVX2 static inline __m256 v_max(__m256 a, __m256 b)
{
    return _mm256_blendv_ps(_mm256_max_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
}

TARGET_AVX2 static inline __m256 ld_f32(const float *p) { return _mm256_loadu_ps(p); }
TARGET_AVX2 static inline void st_f32(float *p, __m256 v) { _mm256_storeu_ps(p, v); }

/* Load 8 lanes of src (element type ET, loader LD) starting at i, of which only m - i may exist. */
#define LOAD8(LD, ET, src, i, m)                                                                   \
    ((i) + 8 <= (m) ? LD((src) + (i)) : ({                                                         \
        ET pad_[8] = {0};                                                                          \
        memcpy(pad_, (src) + (i), ((m) - (i)) * sizeof(ET));                                       \
        LD(pad_);                                                                                  \
    }))

#define STORE8(ST, ET, dst, i, m, v)                                                               \
    do {                                                                                           \
        if ((i) + 8 <= (m)) {                                                                      \
            ST((dst) + (i), v);                                                                    \
        } else {                                                                                   \
            ET pad_[8];                                                                            \
            ST(pad_, v);                                                                           \
            memcpy((dst) + (i), pad_, ((m) - (i)) * sizeof(ET));                                   \
        }                                                                                          \
    } while (0)

/* Lanes i..i+7 of input k (float32 or 16-bit, per in_f32[k]) of the current block, as float32. */
#define LOAD_IN(KIND, k, i)                                                                        \
    (in_f32[k] ? LOAD8(ld_f32, float, (const float *)in[k] + s, i, m)                              \
               : LOAD8(ld_##KIND, uint16_t, (const uint16_t *)in[k] + s, i, m))

/* Same pass structure as the same-type kernels: a pass folds up to MAXG inputs into the running value
 * (input 0, or the float32 accumulator) and stores it to the accumulator or, on the last pass, to out
 * (rounded once to 16 bits unless out is float32). */
#define DEFINE_HALF_AVX2(KIND, OPNAME)                                                             \
    TARGET_AVX2 static void avx2_##KIND##_##OPNAME(void *out, int out_f32, const void *const *in,  \
                                                   const unsigned char *in_f32, size_t n,          \
                                                   size_t start, size_t count)                     \
    {                                                                                              \
        float acc[BLOCK] __attribute__((aligned(32)));                                             \
        size_t block = n <= MAXG + 1 ? count : BLOCK;                                              \
        for (size_t s = start; s < count; s += block) {                                            \
            size_t m = count - s < block ? count - s : block;                                      \
            int from_acc = 0;                                                                      \
            size_t k = 1;                                                                          \
            do {                                                                                   \
                size_t g = n - k < MAXG ? n - k : MAXG;                                            \
                int to_out = k + g == n;                                                           \
                for (size_t i = 0; i < m; i += 8) {                                                \
                    __m256 x = from_acc ? _mm256_load_ps(acc + i) : LOAD_IN(KIND, 0, i);           \
                    for (size_t j = k; j < k + g; j++)                                             \
                        x = v_##OPNAME(x, LOAD_IN(KIND, j, i));                                    \
                    if (!to_out)                                                                   \
                        _mm256_store_ps(acc + i, x);                                               \
                    else if (out_f32)                                                              \
                        STORE8(st_f32, float, (float *)out + s, i, m, x);                          \
                    else                                                                           \
                        STORE8(st_##KIND, uint16_t, (uint16_t *)out + s, i, m, x);                 \
                }                                                                                  \
                from_acc = 1;                                                                      \
                k += g;                                                                            \
            } while (k < n);                                                                       \
        }                                                                                          \
    }


/* Fast path for the common case, every buffer 16-bit: G (1..MAXG) is a compile-time constant after
 * inlining, the lanes are whole vectors (the caller sends the last count % 8 elements to the generic
 * kernel above), so the loop is straight-line loads, converts, folds and one store. */
#define FOLD_H(J, KIND, OPNAME)                                                                    \
    if (G > J)                                                                                     \
        x = v_##OPNAME(x, ld_##KIND(c##J + i));

#define DEFINE_HALF_AVX2_FAST(KIND, OPNAME)                                                        \
    TARGET_AVX2 static inline __attribute__((always_inline)) void fast_##KIND##_##OPNAME##_pass(   \
        uint16_t *dst16, float *acc, const uint16_t *left16, const void *const *in, size_t s,     \
        const size_t G, size_t m, int from_acc, int to_out)                                        \
    {                                                                                              \
        const uint16_t *c0 = (const uint16_t *)in[0] + s;                                          \
        const uint16_t *c1 = (const uint16_t *)in[G > 1 ? 1 : 0] + s;                              \
        const uint16_t *c2 = (const uint16_t *)in[G > 2 ? 2 : 0] + s;                              \
        const uint16_t *c3 = (const uint16_t *)in[G > 3 ? 3 : 0] + s;                              \
        const uint16_t *c4 = (const uint16_t *)in[G > 4 ? 4 : 0] + s;                              \
        const uint16_t *c5 = (const uint16_t *)in[G > 5 ? 5 : 0] + s;                              \
        const uint16_t *c6 = (const uint16_t *)in[G > 6 ? 6 : 0] + s;                              \
        for (size_t i = 0; i < m; i += 8) {                                                        \
            __m256 x = from_acc ? _mm256_load_ps(acc + i) : ld_##KIND(left16 + i);                 \
            FOLD_H(0, KIND, OPNAME) FOLD_H(1, KIND, OPNAME) FOLD_H(2, KIND, OPNAME)                \
            FOLD_H(3, KIND, OPNAME) FOLD_H(4, KIND, OPNAME) FOLD_H(5, KIND, OPNAME)                \
            FOLD_H(6, KIND, OPNAME)                                                                \
            if (to_out)                                                                            \
                st_##KIND(dst16 + i, x);                                                           \
            else                                                                                   \
                _mm256_store_ps(acc + i, x);                                                       \
        }                                                                                          \
    }                                                                                              \
    TARGET_AVX2 static void fast_##KIND##_##OPNAME(uint16_t *out, const void *const *in, size_t n, \
                                                   size_t count)                                   \
    {                                                                                              \
        float acc[BLOCK] __attribute__((aligned(32)));                                             \
        size_t block = n <= MAXG + 1 ? count : BLOCK;                                              \
        for (size_t s = 0; s < count; s += block) {                                                \
            size_t m = count - s < block ? count - s : block;                                      \
            const uint16_t *left = (const uint16_t *)in[0] + s;                                    \
            int from_acc = 0;                                                                      \
            for (size_t k = 1; k < n;) {                                                           \
                size_t g = n - k < MAXG ? n - k : MAXG;                                            \
                int to_out = k + g == n;                                                           \
                switch (g) {                                                                       \
                case 1: fast_##KIND##_##OPNAME##_pass(out + s, acc, left, in + k, s, 1, m, from_acc, to_out); break; \
                case 2: fast_##KIND##_##OPNAME##_pass(out + s, acc, left, in + k, s, 2, m, from_acc, to_out); break; \
                case 3: fast_##KIND##_##OPNAME##_pass(out + s, acc, left, in + k, s, 3, m, from_acc, to_out); break; \
                case 4: fast_##KIND##_##OPNAME##_pass(out + s, acc, left, in + k, s, 4, m, from_acc, to_out); break; \
                case 5: fast_##KIND##_##OPNAME##_pass(out + s, acc, left, in + k, s, 5, m, from_acc, to_out); break; \
                case 6: fast_##KIND##_##OPNAME##_pass(out + s, acc, left, in + k, s, 6, m, from_acc, to_out); break; \
                default: fast_##KIND##_##OPNAME##_pass(out + s, acc, left, in + k, s, 7, m, from_acc, to_out); break; \
                }                                                                                  \
                from_acc = 1;                                                                      \
                k += g;                                                                            \
            }                                                                                      \
        }                                                                                          \
    }

typedef void (*half_kernel)(void *out, int out_f32, const void *const *in, const unsigned char *in_f32,
                            size_t n, size_t start, size_t count);
typedef void (*fast_half_kernel)(uint16_t *out, const void *const *in, size_t n, size_t count);


DEFINE_HALF_AVX2(f16, sum)
DEFINE_HALF_AVX2_FAST(f16, sum)
DEFINE_HALF_AVX2(f16, prod)
DEFINE_HALF_AVX2_FAST(f16, prod)
DEFINE_HALF_AVX2(f16, min)
DEFINE_HALF_AVX2_FAST(f16, min)
DEFINE_HALF_AVX2(f16, max)
DEFINE_HALF_AVX2_FAST(f16, max)
DEFINE_HALF_AVX2(bf16, sum)
DEFINE_HALF_AVX2_FAST(bf16, sum)
DEFINE_HALF_AVX2(bf16, prod)
DEFINE_HALF_AVX2_FAST(bf16, prod)
DEFINE_HALF_AVX2(bf16, min)
DEFINE_HALF_AVX2_FAST(bf16, min)
DEFINE_HALF_AVX2(bf16, max)
DEFINE_HALF_AVX2_FAST(bf16, max)

static const half_kernel avx2_half_table[2][4] = {
    {avx2_f16_sum, avx2_f16_prod, avx2_f16_min, avx2_f16_max},
    {avx2_bf16_sum, avx2_bf16_prod, avx2_bf16_min, avx2_bf16_max},
};
static const fast_half_kernel fast_half_table[2][4] = {
    {fast_f16_sum, fast_f16_prod, fast_f16_min, fast_f16_max},
    {fast_bf16_sum, fast_bf16_prod, fast_bf16_min, fast_bf16_max},
};

/* ------------------------------------------------------------------------------------------------
 * bfloat16 fast path, AVX-512 (F + BW) variant: 16 lanes per step, chosen at run time when the CPU
 * has avx512f and avx512bw. Same instructions' semantics as the AVX2 path lane for lane (IEEE
 * add/mul, (v)minps/(v)maxps + keep-NaN-accumulator, F16C-equivalent conversions, the same integer
 * bfloat16 rounding), so results are bitwise identical. The bfloat16 narrow is the cheap part of the
 * win: a mask register replaces the compare + blend, and vpmovdw replaces packus + permute.
 * ---------------------------------------------------------------------------------------------- */
#define TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx2,f16c")))

TARGET_AVX512 static inline __m512 ld512_bf16(const uint16_t *p)
{
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

TARGET_AVX512 static inline void st512_bf16(uint16_t *p, __m512 v)
{
    __m512i x = _mm512_castps_si512(v);
    __m512i hi = _mm512_srli_epi32(x, 16);
    __m512i bias = _mm512_add_epi32(_mm512_and_si512(hi, _mm512_set1_epi32(1)), _mm512_set1_epi32(0x7fff));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(x, bias), 16);
    __mmask16 isnan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    r = _mm512_mask_or_epi32(r, isnan, hi, _mm512_set1_epi32(0x40)); /* NaN: quiet, keep payload top */
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(r));      /* each lane <= 0xffff */
}

TARGET_AVX512 static inline __m512 v512_sum(__m512 a, __m512 b) { return _mm512_add_ps(a, b); }
TARGET_AVX512 static inline __m512 v512_prod(__m512 a, __m512 b) { return _mm512_mul_ps(a, b); }
TARGET_AVX512 static inline __m512 v512_min(__m512 a, __m512 b)
{
    return _mm512_mask_mov_ps(_mm512_min_ps(a, b), _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), a);
}
TARGET_AVX512 static inline __m512 v512_max(__m512 a, __m512 b)
{
    return _mm512_mask_mov_ps(_mm512_max_ps(a, b), _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), a);
}

#define FOLD_H512(J, KIND, OPNAME)                                                                 \
    if (G > J)                                                                                     \
        x = v512_##OPNAME(x, ld512_##KIND(c##J + i));

#define DEFINE_HALF_AVX512_FAST(KIND, OPNAME)                                                      \
    TARGET_AVX512 static inline __attribute__((always_inline)) void f512_##KIND##_##OPNAME##_pass( \
        uint16_t *dst16, float *acc, const uint16_t *left16, const void *const *in, size_t s,     \
        const size_t G, size_t m, int from_acc, int to_out)                                        \
    {                                                                                              \
        const uint16_t *c0 = (const uint16_t *)in[0] + s;                                          \
        const uint16_t *c1 = (const uint16_t *)in[G > 1 ? 1 : 0] + s;                              \
        const uint16_t *c2 = (const uint16_t *)in[G > 2 ? 2 : 0] + s;                              \
        const uint16_t *c3 = (const uint16_t *)in[G > 3 ? 3 : 0] + s;                              \
        const uint16_t *c4 = (const uint16_t *)in[G > 4 ? 4 : 0] + s;                              \
        const uint16_t *c5 = (const uint16_t *)in[G > 5 ? 5 : 0] + s;                              \
        const uint16_t *c6 = (const uint16_t *)in[G > 6 ? 6 : 0] + s;                              \
        for (size_t i = 0; i < m; i += 16) {                                                       \
            __m512 x = from_acc ? _mm512_load_ps(acc + i) : ld512_##KIND(left16 + i);              \
            FOLD_H512(0, KIND, OPNAME) FOLD_H512(1, KIND, OPNAME) FOLD_H512(2, KIND, OPNAME)       \
            FOLD_H512(3, KIND, OPNAME) FOLD_H512(4, KIND, OPNAME) FOLD_H512(5, KIND, OPNAME)       \
            FOLD_H512(6, KIND, OPNAME)                                                             \
            if (to_out)                                                                            \
                st512_##KIND(dst16 + i, x);                                                        \
            else                                                                                   \
                _mm512_store_ps(acc + i, x);                                                       \
        }                                                                                          \
    }                                                                                              \
    TARGET_AVX512 static void f512_##KIND##_##OPNAME(uint16_t *out, const void *const *in, size_t n, \
                                                     size_t count)                                 \
    {                                                                                              \
        float acc[BLOCK] __attribute__((aligned(64)));                                             \
        size_t block = n <= MAXG + 1 ? count : BLOCK;                                              \
        for (size_t s = 0; s < count; s += block) {                                                \
            size_t m = count - s < block ? count - s : block;                                      \
            const uint16_t *left = (const uint16_t *)in[0] + s;                                    \
            int from_acc = 0;                                                                      \
            for (size_t k = 1; k < n;) {                                                           \
                size_t g = n - k < MAXG ? n - k : MAXG;                                            \
                int to_out = k + g == n;                                                           \
                switch (g) {                                                                       \
                case 1: f512_##KIND##_##OPNAME##_pass(out + s, acc, left, in + k, s, 1, m, from_acc, to_out); break; \
                case 2: f512_##KIND##_##OPNAME##_pass(out + s, acc, left, in + k, s, 2, m, from_acc, to_out); break; \
                case 3: f512_##KIND##_##OPNAME##_pass(out + s, acc, left, in + k, s, 3, m, from_acc, to_out); break; \
                case 4: f512_##KIND##_##OPNAME##_pass(out + s, acc, left, in + k, s, 4, m, from_acc, to_out); break; \
                case 5: f512_##KIND##_##OPNAME##_pass(out + s, acc, left, in + k, s, 5, m, from_acc, to_out); break; \
                case 6: f512_##KIND##_##OPNAME##_pass(out + s, acc, left, in + k, s, 6, m, from_acc, to_out); break; \
                default: f512_##KIND##_##OPNAME##_pass(out + s, acc, left, in + k, s, 7, m, from_acc, to_out); break; \
                }                                                                                  \
                from_acc = 1;                                                                      \
                k += g;                                                                            \
            }                                                                                      \
        }                                                                                          \
    }

DEFINE_HALF_AVX512_FAST(bf16, sum)
DEFINE_HALF_AVX512_FAST(bf16, prod)
DEFINE_HALF_AVX512_FAST(bf16, min)
DEFINE_HALF_AVX512_FAST(bf16, max)

/* bfloat16 only: float16 already runs at memory speed on the AVX2 path (vcvtph2ps/vcvtps2ph do the
 * conversions in one instruction each), and keeping it there keeps its NaN payloads exactly as before
 * (when two NaNs meet, which payload survives depends on the compiler's operand order). */
static const fast_half_kernel avx512_bf16_table[4] = {f512_bf16_sum, f512_bf16_prod, f512_bf16_min,
                                                      f512_bf16_max};
#endif /* COLL_X86 */

int coll_reduce_half(int half_kind, int op, void *out, int out_is_f32, const void *const *inputs,
                     const unsigned char *in_is_f32, size_t n_inputs, size_t count)
{
    if (half_kind < 0 || half_kind > COLL_HALF_BF16 || op < 0 || op > COLL_MAX || n_inputs < 1)
        return -1;
    if (count == 0)
        return 0;
    /* one 16-bit input copied to a 16-bit out is a plain copy (keeps NaN payloads bit for bit) */
    if (n_inputs == 1 && !out_is_f32 && !in_is_f32[0]) {
        if (out != inputs[0])
            memmove(out, inputs[0], count * 2);
        return 0;
    }
#if COLL_X86
    if (coll_cpu_path()) {
        size_t start = 0;
        int all16 = !out_is_f32;
        for (size_t k = 0; k < n_inputs && all16; k++)
            all16 = !in_is_f32[k];
        if (all16 && half_kind == COLL_HALF_BF16 && coll_cpu_avx512()) {
            /* whole vectors on a fast path, the ragged end on the generic one */
            start = count & ~(size_t)15;
            avx512_bf16_table[op]((uint16_t *)out, inputs, n_inputs, start);
        } else if (all16) {
            start = count & ~(size_t)7;
            fast_half_table[half_kind][op]((uint16_t *)out, inputs, n_inputs, start);
        }
        if (start < count)
            avx2_half_table[half_kind][op](out, out_is_f32, inputs, in_is_f32, n_inputs, start, count);
        return 0;
    }
#endif
    half_portable(half_kind, op, out, out_is_f32, inputs, in_is_f32, n_inputs, count);
    return 0;
}
