/* Decode attention over the paged KV cache in one pass over K and one over V.
 *
 * Gathering a sequence's blocks into a contiguous tensor and then running SDPA reads the K/V cache
 * three times (read, write the copy, read the copy) and pads every row to the longest context of its
 * group. This kernel walks each sequence's block table in place instead, so decode reads exactly the
 * bytes its floor counts. Built at first use by native.py with the machine's own compiler.
 *
 * Layout (the engine's):  q, out  [rows, H, D] (row stride given, heads contiguous, D contiguous)
 *                         caches  [num_blocks, BS, KVH, D]
 *                         tables  [n, table_stride] int32, lens [n] int32, rows [n] int64
 * Work item (sequence i, KV head h): the G = H / KVH query heads that share h are scored against each
 * K row once (pass 1, which also keeps each head's maximum), exponentiated in a per-thread scratch of
 * G * len floats in one pass, then V is accumulated in registers (pass 2), which divides its G * D sums
 * by the exponentials' sums. Items run in parallel on the OpenMP pool that torch's own ops use.
 * One thread, one sequence of 1,024 tokens in cache: 10.5 -> 9.9 ns per token against a max pass,
 * an exp pass and a scaling pass of their own.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "fast_exp.h"
#ifdef _OPENMP
#include <omp.h>
#endif

/* The widest float vector the target has: 16 lanes with AVX-512, 8 with AVX, else 4 (SSE, NEON).
 * ITL_PREFER_256 (native.py sets it on AMD family 19h, whose AVX-512 runs each operation as two
 * 256-bit halves) keeps 8 lanes: there 16-lane score reductions cost more than the wider loads save
 * (a cpu-small layer, batch 8 x 880, one thread: 132 vs 170-178 µs). */
#if defined(__AVX512F__) && !defined(ITL_PREFER_256)
#define VW 16
#elif defined(__AVX__)
#define VW 8
#else
#define VW 4
#endif
typedef float vf __attribute__((vector_size(VW * 4)));
typedef float vf_unaligned __attribute__((vector_size(VW * 4), aligned(4), may_alias));
typedef int32_t vfi __attribute__((vector_size(VW * 4)));

static inline vf loadv(const float *p) { return *(const vf_unaligned *)p; }
static inline vf vmax(vf a, vf b)
{
    const vfi m = a > b;
    return (vf)(((vfi)a & m) | ((vfi)b & ~m));
}

/* A sequence's blocks sit anywhere in the cache once requests come and go (decode appends interleave
 * sequences' blocks; freed blocks return in any order), and the hardware prefetcher, which follows a
 * stream, restarts at every jump. So while block b is computed, block b + AHEAD's rows of this head
 * are fetched into L2, unless that block directly follows the one before it (the stream the hardware
 * already follows). Into L2 (locality hint 2), not L1: a block's 32 lines at once overrun L1's few
 * miss buffers. 32 sequences, two threads, µs per layer, no prefetch / into L1 / into L2: 512 tokens
 * in random blocks 335 / 246 / 183; 8k tokens in blocks interleaved as decode appends them
 * - / 4,756 / 3,752. A sequence whose blocks all follow each other takes a build of the loops
 * without any of this: there even the untaken test cost 5-10 %, and prefetching anyway 0-10 %. */
#define AHEAD 2
static inline __attribute__((always_inline)) void prefetch_block(const float *head, const int32_t *tab, int64_t blk,
                                                                 int64_t nblk, int64_t BS, int64_t row, int64_t D)
{
    if (blk >= nblk || tab[blk] == tab[blk - 1] + 1) return;
    const float *b = head + (int64_t)tab[blk] * BS * row;
    for (int64_t t = 0; t < BS; t++)
        for (int64_t off = 0; off < D; off += 64 / (int64_t)sizeof(float)) __builtin_prefetch(b + t * row + off, 0, 2);
}

/* Most query heads per K/V head on the vector path (the scalar one takes any group). A fixed-size
 * array, not a variable-length one: once a shape's G is a constant its elements live in registers,
 * where a variable-length array stays on the stack. */
#define MAX_G 16
#define MAX_ACC 32 /* G * D / VW accumulators on the one-pass path */
#define MAX_BS 64  /* block size on the one-pass path */
#define SB 2       /* blocks per step of the one-pass path: its bookkeeping per 32 tokens, not 16 */
#define ONE_PASS_JUMPS 8 /* the one-pass path takes sequences with at most one jump in 8 blocks */

#define PAIR(a, b, lo, hi) (__builtin_shuffle((a), (b), (lo)) + __builtin_shuffle((a), (b), (hi)))

/* p[t] holds VW partial products of token t; the result's lane t is their sum. Each level pairs
 * vectors and halves the partial sums per token: log2(VW) levels, VW - 1 pairings in all. */
#define LEVEL(n, lo, hi)                                                                    \
    do {                                                                                    \
        const vfi l_ = lo, h_ = hi;                                                         \
        for (int i = 0; i < (n) / 2; i++) p[i] = PAIR(p[2 * i], p[2 * i + 1], l_, h_);      \
    } while (0)

static inline vf lane_sums(vf p[VW])
{
#if VW == 16
    LEVEL(16, ((vfi){0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23}),
          ((vfi){8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31}));
    LEVEL(8, ((vfi){0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27}),
          ((vfi){4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31}));
    LEVEL(4, ((vfi){0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29}),
          ((vfi){2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31}));
    LEVEL(2, ((vfi){0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30}),
          ((vfi){1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31}));
#elif VW == 8
    LEVEL(8, ((vfi){0, 1, 2, 3, 8, 9, 10, 11}), ((vfi){4, 5, 6, 7, 12, 13, 14, 15}));
    LEVEL(4, ((vfi){0, 1, 4, 5, 8, 9, 12, 13}), ((vfi){2, 3, 6, 7, 10, 11, 14, 15}));
    LEVEL(2, ((vfi){0, 2, 4, 6, 8, 10, 12, 14}), ((vfi){1, 3, 5, 7, 9, 11, 13, 15}));
#else
    LEVEL(4, ((vfi){0, 1, 4, 5}), ((vfi){2, 3, 6, 7}));
    LEVEL(2, ((vfi){0, 2, 4, 6}), ((vfi){1, 3, 5, 7}));
#endif
    return p[0];
}

/* Scores of VW tokens from `kr` on (`m` of them real, m <= VW) for the G query heads: scale * q_g . k_t
 * into scores[g * len + t], each head's running maximum kept in mx[g] for the softmax. */
static inline __attribute__((always_inline)) void score_tokens(const float *restrict qh, const float *restrict kr,
                                                               int64_t m, int64_t G, int64_t D, int64_t row,
                                                               float scale, float *restrict scores, int64_t len,
                                                               vf *restrict mx)
{
    const int64_t nv = D / VW;
#pragma GCC unroll 16
    for (int64_t g = 0; g < G; g++) {
        const float *qg = qh + g * D;
        vf p[VW];
        for (int64_t t = 0; t < VW; t++) {
            vf acc = {0};
            if (t < m)
                for (int64_t j = 0; j < nv; j++) acc += loadv(kr + t * row + VW * j) * loadv(qg + VW * j);
            p[t] = acc;
        }
        const vf s = lane_sums(p) * scale;
        if (m == VW) {
            *(vf_unaligned *)(scores + g * len) = s;
            mx[g] = vmax(mx[g], s);
        } else {
            for (int64_t t = 0; t < m; t++) {
                scores[g * len + t] = s[t];
                mx[g][0] = mx[g][0] > s[t] ? mx[g][0] : s[t];
            }
        }
    }
}

/* Pass 1 for one (sequence, KV head): scores[g * len + t] = scale * q_g . k_t, and each head's
 * maximum score into mx_out[g]. Inlined into `scores_vec` with G and D as constants for the common
 * head shapes, so the loops over D unroll and partial sums stay in registers; whole groups of VW
 * tokens take a copy of `score_tokens` without the per-token test. */
static inline __attribute__((always_inline)) void scores_body(
    const float *restrict qh, const float *restrict kc, const int32_t *restrict tab, int64_t len,
    int64_t G, int64_t D, int64_t BS, int64_t row, float scale, float *restrict scores, float *restrict mx_out,
    int scattered)
{
    const int64_t nblk = (len + BS - 1) / BS;
    vf mx[MAX_G];
    for (int64_t g = 0; g < G; g++) mx[g] = (vf){0} - INFINITY;
    for (int64_t t0 = 0; t0 < len; t0 += BS) {
        if (scattered) prefetch_block(kc, tab, t0 / BS + AHEAD, nblk, BS, row, D);
        const float *kb = kc + (int64_t)tab[t0 / BS] * BS * row;
        const int64_t n = len - t0 < BS ? len - t0 : BS;
        int64_t s0 = 0;
        for (; s0 + VW <= n; s0 += VW) score_tokens(qh, kb + s0 * row, VW, G, D, row, scale, scores + t0 + s0, len, mx);
        if (s0 < n) score_tokens(qh, kb + s0 * row, n - s0, G, D, row, scale, scores + t0 + s0, len, mx);
    }
    for (int64_t g = 0; g < G; g++) {
        float m = -INFINITY;
        for (int t = 0; t < VW; t++) m = mx[g][t] > m ? mx[g][t] : m;
        mx_out[g] = m;
    }
}

static void scores_scalar(const float *restrict qh, const float *restrict kc, const int32_t *restrict tab,
                          int64_t len, int64_t G, int64_t D, int64_t BS, int64_t row, float scale,
                          float *restrict scores, float *restrict mx)
{
    for (int64_t g = 0; g < G; g++) mx[g] = -INFINITY;
    for (int64_t t = 0; t < len; t++) {
        const float *kr = kc + ((int64_t)tab[t / BS] * BS + t % BS) * row;
        for (int64_t g = 0; g < G; g++) {
            float s = 0.0f;
            for (int64_t d = 0; d < D; d++) s += qh[g * D + d] * kr[d];
            scores[g * len + t] = s * scale;
            mx[g] = s * scale > mx[g] ? s * scale : mx[g];
        }
    }
}

/* The softmax's one pass: scores become exp(score - max) in place, and inv[g] the reciprocal of
 * their sum, which pass 2 applies to its G * D sums instead of to G * len probabilities here (the
 * maxima come from pass 1, so no pass over the scores finds them). */
static void exp_rows(float *restrict scores, int64_t G, int64_t len, const float *restrict mx,
                     float *restrict inv)
{
    for (int64_t g = 0; g < G; g++) {
        float *sc = scores + g * len;
        const float m = mx[g];
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t t = 0; t < len; t++) {
            sc[t] = fast_exp(sc[t] - m);
            sum += sc[t];
        }
        inv[g] = 1.0f / sum;
    }
}

/* acc[g * nv + j] += p[g * pstride + t] * (lanes j of V row t), for the n rows of one block. */
static inline __attribute__((always_inline)) void add_v_rows(const float *restrict vb, int64_t n,
                                                             const float *restrict p, int64_t pstride, int64_t G,
                                                             int64_t nv, int64_t row, vf *restrict acc)
{
    for (int64_t t = 0; t < n; t++) {
        const float *vr = vb + t * row;
        for (int64_t g = 0; g < G; g++) {
            const float pg = p[g * pstride + t];
            for (int64_t j = 0; j < nv; j++) acc[g * nv + j] += pg * loadv(vr + VW * j);
        }
    }
}

/* Pass 2: out_g = inv[g] * sum_t e_g[t] v_t, accumulated in registers (for the shapes `values_vec`
 * fixes). */
static inline __attribute__((always_inline)) void values_body(
    const float *restrict probs, const float *restrict vc, const int32_t *restrict tab, int64_t len,
    int64_t G, int64_t D, int64_t BS, int64_t row, const float *restrict inv, float *restrict out, int scattered)
{
    const int64_t nv = D / VW;
    vf acc[G * nv];
    memset(acc, 0, sizeof acc);
    const int64_t nblk = (len + BS - 1) / BS;
    for (int64_t t0 = 0; t0 < len; t0 += BS) {
        if (scattered) prefetch_block(vc, tab, t0 / BS + AHEAD, nblk, BS, row, D);
        const float *vb = vc + (int64_t)tab[t0 / BS] * BS * row;
        add_v_rows(vb, len - t0 < BS ? len - t0 : BS, probs + t0, len, G, nv, row, acc);
    }
    for (int64_t k = 0; k < G * nv; k++) *(vf_unaligned *)(out + VW * k) = acc[k] * inv[k / nv];
}

static void values_scalar(const float *restrict probs, const float *restrict vc, const int32_t *restrict tab,
                          int64_t len, int64_t G, int64_t D, int64_t BS, int64_t row, const float *restrict inv,
                          float *restrict out)
{
    memset(out, 0, (size_t)(G * D) * sizeof(float));
    for (int64_t t = 0; t < len; t++) {
        const float *vr = vc + ((int64_t)tab[t / BS] * BS + t % BS) * row;
        for (int64_t g = 0; g < G; g++) {
            const float pg = probs[g * len + t];
            for (int64_t d = 0; d < D; d++) out[g * D + d] += pg * vr[d];
        }
    }
    for (int64_t k = 0; k < G * D; k++) out[k] *= inv[k / D];
}

/* Group sizes and head dims of the presets (and Llama-3 at large) as compile-time constants; any
 * other shape runs the same code with run-time sizes. */
#define SHAPES(call, G, D)                                                                          \
    do {                                                                                            \
        if (G == 4 && D == 32) call(4, 32);                                                         \
        else if (G == 4 && D == 64) call(4, 64);                                                    \
        else if (G == 4 && D == 128) call(4, 128);                                                  \
        else if (G == 2 && D == 32) call(2, 32);                                                    \
        else if (G == 8 && D == 128) call(8, 128);                                                  \
        else call(G, D);                                                                            \
    } while (0)

static void scores_vec(const float *restrict qh, const float *restrict kc, const int32_t *restrict tab,
                       int64_t len, int64_t G, int64_t D, int64_t BS, int64_t row, float scale,
                       float *restrict scores, float *restrict mx, int scattered)
{
#define SCORES(g, d)                                                                                \
    (scattered ? scores_body(qh, kc, tab, len, g, d, BS, row, scale, scores, mx, 1)                 \
               : scores_body(qh, kc, tab, len, g, d, BS, row, scale, scores, mx, 0))
    SHAPES(SCORES, G, D);
#undef SCORES
}

static void values_vec(const float *restrict probs, const float *restrict vc, const int32_t *restrict tab,
                       int64_t len, int64_t G, int64_t D, int64_t BS, int64_t row, const float *restrict inv,
                       float *restrict out, int scattered)
{
#define VALUES(g, d)                                                                                \
    (scattered ? values_body(probs, vc, tab, len, g, d, BS, row, inv, out, 1)                       \
               : values_body(probs, vc, tab, len, g, d, BS, row, inv, out, 0))
    SHAPES(VALUES, G, D);
#undef VALUES
}

/* fast_exp on a vector (the same steps; rint by the 1.5 * 2^23 trick, which rounds to nearest even
 * as rint does in the default rounding mode): GCC does not vectorize the scalar one's calls. */
static inline vf vexp(vf x)
{
    const vf magic = (vf){0} + 12582912.0f;
    x = vmax(x, (vf){0} - 87.0f);
    x = -vmax(-x, (vf){0} - 88.0f);
    const vf t = x * ITL_LOG2E + magic, n = t - magic;
    const vf r = ITL_EXP_REDUCE(x, n), p = ITL_EXP_POLY(r);
    return (vf)((vfi)p + (((vfi)t - (vfi)magic) << 23));
}

/* The maximum of x's lanes, in every lane. */
static inline vf hmax_all(vf x)
{
#if VW == 16
    x = vmax(x, __builtin_shuffle(x, (vfi){8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7}));
    x = vmax(x, __builtin_shuffle(x, (vfi){4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11}));
    x = vmax(x, __builtin_shuffle(x, (vfi){2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13}));
    return vmax(x, __builtin_shuffle(x, (vfi){1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14}));
#elif VW == 8
    x = vmax(x, __builtin_shuffle(x, (vfi){4, 5, 6, 7, 0, 1, 2, 3}));
    x = vmax(x, __builtin_shuffle(x, (vfi){2, 3, 0, 1, 6, 7, 4, 5}));
    return vmax(x, __builtin_shuffle(x, (vfi){1, 0, 3, 2, 5, 4, 7, 6}));
#else
    x = vmax(x, __builtin_shuffle(x, (vfi){2, 3, 0, 1}));
    return vmax(x, __builtin_shuffle(x, (vfi){1, 0, 3, 2}));
#endif
}

/* Sequences whose blocks mostly follow each other (a prompt's blocks, then the few that decode
 * appended) take one pass over K and V together (an online softmax) instead of the two passes above: per SB blocks, their scores, each head's running maximum
 * (its sum and accumulators rescaled when it rises), the exponentials, then the blocks' V rows. Two
 * streams at once keep more of the cache's lines in flight than one: 32 sequences x 8k tokens, two
 * threads, alternating with a plain two-thread read of 512 MB, K/V read at 38.1 against 28.8 GB/s
 * in rounds where that read got 45+ GB/s, 29.3 against 26.8 at 35-45, 28.8 against 25.5 below.
 * Where every block jumps it gains nothing (8k: 3.8 vs 4.0 ms) and loses at 512 tokens (204-226
 * vs 193-197 µs), where two prefetched streams cost more than they overlap; those sequences keep
 * the two passes. */
static inline __attribute__((always_inline)) void online_body(
    const float *restrict qh, const float *restrict kc, const float *restrict vc, const int32_t *restrict tab,
    int64_t len, int64_t G, int64_t D, int64_t BS, int64_t row, float scale, float *restrict out, int scattered)
{
    const int64_t nv = D / VW, nblk = (len + BS - 1) / BS, sbp = SB * BS;
    vf acc[MAX_ACC], m[MAX_G], l[MAX_G];
    float s[MAX_G * SB * MAX_BS] __attribute__((aligned(64)));
    for (int64_t k = 0; k < G * nv; k++) acc[k] = (vf){0};
    for (int64_t g = 0; g < G; g++) { m[g] = (vf){0} - INFINITY; l[g] = (vf){0}; }
    for (int64_t b0 = 0; b0 < nblk; b0 += SB) {
        const int64_t nb = nblk - b0 < SB ? nblk - b0 : SB;
        vf mx[MAX_G];
        for (int64_t g = 0; g < G; g++) mx[g] = (vf){0} - INFINITY;
        int64_t n = 0;  /* tokens of this super-block, scores at s + n (stride sbp per head) */
        for (int64_t b = b0; b < b0 + nb; b++) {
            if (scattered) {
                prefetch_block(kc, tab, b + AHEAD, nblk, BS, row, D);
                prefetch_block(vc, tab, b + AHEAD, nblk, BS, row, D);
            }
            const int64_t nt = len - b * BS < BS ? len - b * BS : BS;
            const float *kb = kc + (int64_t)tab[b] * BS * row;
            int64_t s0 = 0;
            for (; s0 + VW <= nt; s0 += VW) score_tokens(qh, kb + s0 * row, VW, G, D, row, scale, s + n + s0, sbp, mx);
            if (s0 < nt) score_tokens(qh, kb + s0 * row, nt - s0, G, D, row, scale, s + n + s0, sbp, mx);
            n += nt;
        }
        for (int64_t g = 0; g < G; g++) {
            const vf bm = hmax_all(mx[g]);
            if (bm[0] > m[g][0]) {
                const float c = fast_exp(m[g][0] - bm[0]);
                l[g] *= c;
                for (int64_t j = 0; j < nv; j++) acc[g * nv + j] *= c;
                m[g] = bm;
            }
            float *sg = s + g * sbp;
            int64_t t = 0;
            for (; t + VW <= n; t += VW) {
                const vf e = vexp(loadv(sg + t) - m[g]);
                *(vf_unaligned *)(sg + t) = e;
                l[g] += e;
            }
            for (; t < n; t++) {
                sg[t] = fast_exp(sg[t] - m[g][0]);
                l[g][0] += sg[t];
            }
        }
        for (int64_t b = b0, t0 = 0; b < b0 + nb; b++, t0 += BS) {
            const float *vb = vc + (int64_t)tab[b] * BS * row;
            add_v_rows(vb, n - t0 < BS ? n - t0 : BS, s + t0, sbp, G, nv, row, acc);
        }
    }
    for (int64_t g = 0; g < G; g++) {
        float sum = 0.0f;
        for (int i = 0; i < VW; i++) sum += l[g][i];
        for (int64_t j = 0; j < nv; j++) *(vf_unaligned *)(out + g * D + VW * j) = acc[g * nv + j] * (1.0f / sum);
    }
}

static void online_vec(const float *restrict qh, const float *restrict kc, const float *restrict vc,
                       const int32_t *restrict tab, int64_t len, int64_t G, int64_t D, int64_t BS, int64_t row,
                       float scale, float *restrict out, int scattered)
{
#define ONLINE(g, d)                                                                                \
    (scattered ? online_body(qh, kc, vc, tab, len, g, d, BS, row, scale, out, 1)                    \
               : online_body(qh, kc, vc, tab, len, g, d, BS, row, scale, out, 0))
    SHAPES(ONLINE, G, D);
#undef ONLINE
}

/* How many of the first `nblk` blocks do not directly follow the one before them. */
static int64_t block_jumps(const int32_t *tab, int64_t nblk)
{
    int64_t jumps = 0;
    for (int64_t b = 1; b < nblk; b++) jumps += tab[b] != tab[b - 1] + 1;
    return jumps;
}

/* Returns 0, or -1 when a sequence is longer than the scratch allows (nothing is written then). */
int itl_paged_decode_f32(const float *q, int64_t q_row_stride, const int64_t *rows, const float *k_cache,
                         const float *v_cache, const int32_t *tables, int64_t table_stride,
                         const int32_t *lens, float *out, int64_t out_row_stride, int64_t n, int64_t H,
                         int64_t KVH, int64_t D, int64_t BS, float scale, float *scratch,
                         int64_t scratch_per_thread, int64_t num_threads)
{
    const int64_t G = H / KVH, row = KVH * D;
    for (int64_t i = 0; i < n; i++)
        if (G * (int64_t)lens[i] > scratch_per_thread) return -1;
    const int vec = D % VW == 0 && G <= MAX_G;
    const int64_t items = n * KVH;
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads) if (num_threads > 1 && items > 1)
    for (int64_t it = 0; it < items; it++) {
        const int64_t i = it / KVH, h = it % KVH;
#ifdef _OPENMP
        float *sc = scratch + (int64_t)omp_get_thread_num() * scratch_per_thread;
#else
        float *sc = scratch;
#endif
        const int64_t len = lens[i];
        const int32_t *tab = tables + i * table_stride;
        const float *qh = q + rows[i] * q_row_stride + h * G * D;
        float *oh = out + rows[i] * out_row_stride + h * G * D;
        const float *kc = k_cache + h * D, *vc = v_cache + h * D;
        const int64_t nblk = (len + BS - 1) / BS, jumps = vec ? block_jumps(tab, nblk) : 0;
        const int scattered = jumps > 0;
        if (vec && jumps * ONE_PASS_JUMPS <= nblk && G * D / VW <= MAX_ACC && BS <= MAX_BS) {
            online_vec(qh, kc, vc, tab, len, G, D, BS, row, scale, oh, scattered);
            continue;
        }
        float mx[G], inv[G];
        if (vec) scores_vec(qh, kc, tab, len, G, D, BS, row, scale, sc, mx, scattered);
        else scores_scalar(qh, kc, tab, len, G, D, BS, row, scale, sc, mx);
        exp_rows(sc, G, len, mx, inv);
        if (vec) values_vec(sc, vc, tab, len, G, D, BS, row, inv, oh, scattered);
        else values_scalar(sc, vc, tab, len, G, D, BS, row, inv, oh);
    }
    return 0;
}

/* Writes this step's K and V rows (k, v: [n, KVH * D] with the given row strides) into their cache
 * slots (slot_mapping: block_id * BS + offset), as index_copy_ would, in one call for both caches. */
void itl_write_kv_f32(const float *k, int64_t k_row_stride, const float *v, int64_t v_row_stride,
                      float *k_cache, float *v_cache, const int64_t *slot_mapping, int64_t n, int64_t row)
{
    for (int64_t i = 0; i < n; i++) {
        memcpy(k_cache + slot_mapping[i] * row, k + i * k_row_stride, (size_t)row * sizeof(float));
        memcpy(v_cache + slot_mapping[i] * row, v + i * v_row_stride, (size_t)row * sizeof(float));
    }
}
