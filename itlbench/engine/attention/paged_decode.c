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
 * K row once (pass 1), soft-maxed in a per-thread scratch of G * len floats, then V is accumulated in
 * registers (pass 2). Items run in parallel on the OpenMP pool that torch's own ops use.
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

/* A sequence's blocks sit anywhere in the cache once requests come and go (decode appends interleave
 * sequences' blocks; freed blocks return in any order), and the hardware prefetcher, which follows a
 * stream, restarts at every jump. So while block b is computed, block b + AHEAD's rows of this head
 * are fetched, unless that block directly follows the one before it (the stream the hardware already
 * follows). 32 sequences x 512 tokens, K/V blocks scattered at random, two threads: 335 -> 233 µs per
 * layer. A sequence whose blocks all follow each other takes a build of the loops without any of
 * this: there even the untaken test cost 5-10 %. */
#define AHEAD 2
static inline __attribute__((always_inline)) void prefetch_block(const float *head, const int32_t *tab, int64_t blk,
                                                                 int64_t nblk, int64_t BS, int64_t row, int64_t D)
{
    if (blk >= nblk || tab[blk] == tab[blk - 1] + 1) return;
    const float *b = head + (int64_t)tab[blk] * BS * row;
    for (int64_t t = 0; t < BS; t++)
        for (int64_t off = 0; off < D; off += 64 / (int64_t)sizeof(float)) __builtin_prefetch(b + t * row + off, 0, 3);
}

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

/* Pass 1 for one (sequence, KV head): scores[g * len + t] = scale * q_g . k_t. Inlined into
 * `scores_vec` with G and D as constants for the common head shapes, so the loops over D unroll
 * and partial sums stay in registers. */
static inline __attribute__((always_inline)) void scores_body(
    const float *restrict qh, const float *restrict kc, const int32_t *restrict tab, int64_t len,
    int64_t G, int64_t D, int64_t BS, int64_t row, float scale, float *restrict scores, int scattered)
{
    const int64_t nv = D / VW, nblk = (len + BS - 1) / BS;
    for (int64_t t0 = 0; t0 < len; t0 += BS) {
        if (scattered) prefetch_block(kc, tab, t0 / BS + AHEAD, nblk, BS, row, D);
        const float *kb = kc + (int64_t)tab[t0 / BS] * BS * row;
        const int64_t n = len - t0 < BS ? len - t0 : BS;
        for (int64_t s0 = 0; s0 < n; s0 += VW) {
            const int64_t m = n - s0 < VW ? n - s0 : VW;
            for (int64_t g = 0; g < G; g++) {
                const float *qg = qh + g * D;
                vf p[VW];
                for (int64_t t = 0; t < VW; t++) {
                    vf acc = {0};
                    if (t < m) {
                        const float *kr = kb + (s0 + t) * row;
                        for (int64_t j = 0; j < nv; j++) acc += loadv(kr + VW * j) * loadv(qg + VW * j);
                    }
                    p[t] = acc;
                }
                const vf s = lane_sums(p) * scale;
                if (m == VW) *(vf_unaligned *)(scores + g * len + t0 + s0) = s;
                else for (int64_t t = 0; t < m; t++) scores[g * len + t0 + s0 + t] = s[t];
            }
        }
    }
}

static void scores_scalar(const float *restrict qh, const float *restrict kc, const int32_t *restrict tab,
                          int64_t len, int64_t G, int64_t D, int64_t BS, int64_t row, float scale,
                          float *restrict scores)
{
    for (int64_t t = 0; t < len; t++) {
        const float *kr = kc + ((int64_t)tab[t / BS] * BS + t % BS) * row;
        for (int64_t g = 0; g < G; g++) {
            float s = 0.0f;
            for (int64_t d = 0; d < D; d++) s += qh[g * D + d] * kr[d];
            scores[g * len + t] = s * scale;
        }
    }
}

static void softmax_rows(float *restrict scores, int64_t G, int64_t len)
{
    for (int64_t g = 0; g < G; g++) {
        float *sc = scores + g * len;
        float mx = -INFINITY, sum = 0.0f;
#pragma omp simd reduction(max : mx)
        for (int64_t t = 0; t < len; t++) mx = sc[t] > mx ? sc[t] : mx;
#pragma omp simd reduction(+ : sum)
        for (int64_t t = 0; t < len; t++) {
            sc[t] = fast_exp(sc[t] - mx);
            sum += sc[t];
        }
        const float inv = 1.0f / sum;
#pragma omp simd
        for (int64_t t = 0; t < len; t++) sc[t] *= inv;
    }
}

/* Pass 2: out_g = sum_t p_g[t] v_t, accumulated in registers (for the shapes `values_vec` fixes). */
static inline __attribute__((always_inline)) void values_body(
    const float *restrict probs, const float *restrict vc, const int32_t *restrict tab, int64_t len,
    int64_t G, int64_t D, int64_t BS, int64_t row, float *restrict out, int scattered)
{
    const int64_t nv = D / VW;
    vf acc[G * nv];
    memset(acc, 0, sizeof acc);
    const int64_t nblk = (len + BS - 1) / BS;
    for (int64_t t0 = 0; t0 < len; t0 += BS) {
        if (scattered) prefetch_block(vc, tab, t0 / BS + AHEAD, nblk, BS, row, D);
        const float *vb = vc + (int64_t)tab[t0 / BS] * BS * row;
        const int64_t n = len - t0 < BS ? len - t0 : BS;
        for (int64_t t = 0; t < n; t++) {
            const float *vr = vb + t * row;
            for (int64_t g = 0; g < G; g++) {
                const float pg = probs[g * len + t0 + t];
                for (int64_t j = 0; j < nv; j++) acc[g * nv + j] += pg * loadv(vr + VW * j);
            }
        }
    }
    for (int64_t k = 0; k < G * nv; k++) *(vf_unaligned *)(out + VW * k) = acc[k];
}

static void values_scalar(const float *restrict probs, const float *restrict vc, const int32_t *restrict tab,
                          int64_t len, int64_t G, int64_t D, int64_t BS, int64_t row, float *restrict out)
{
    memset(out, 0, (size_t)(G * D) * sizeof(float));
    for (int64_t t = 0; t < len; t++) {
        const float *vr = vc + ((int64_t)tab[t / BS] * BS + t % BS) * row;
        for (int64_t g = 0; g < G; g++) {
            const float pg = probs[g * len + t];
            for (int64_t d = 0; d < D; d++) out[g * D + d] += pg * vr[d];
        }
    }
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
                       float *restrict scores, int scattered)
{
#define SCORES(g, d)                                                                                \
    (scattered ? scores_body(qh, kc, tab, len, g, d, BS, row, scale, scores, 1)                     \
               : scores_body(qh, kc, tab, len, g, d, BS, row, scale, scores, 0))
    SHAPES(SCORES, G, D);
#undef SCORES
}

static void values_vec(const float *restrict probs, const float *restrict vc, const int32_t *restrict tab,
                       int64_t len, int64_t G, int64_t D, int64_t BS, int64_t row, float *restrict out,
                       int scattered)
{
#define VALUES(g, d)                                                                                \
    (scattered ? values_body(probs, vc, tab, len, g, d, BS, row, out, 1)                            \
               : values_body(probs, vc, tab, len, g, d, BS, row, out, 0))
    SHAPES(VALUES, G, D);
#undef VALUES
}

/* Whether any of the first `nblk` blocks does not directly follow the one before it. */
static int scattered_blocks(const int32_t *tab, int64_t nblk)
{
    for (int64_t b = 1; b < nblk; b++)
        if (tab[b] != tab[b - 1] + 1) return 1;
    return 0;
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
    const int vec = D % VW == 0;
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
        const int scattered = vec && scattered_blocks(tab, (len + BS - 1) / BS);
        if (vec) scores_vec(qh, kc, tab, len, G, D, BS, row, scale, sc, scattered);
        else scores_scalar(qh, kc, tab, len, G, D, BS, row, scale, sc);
        softmax_rows(sc, G, len);
        if (vec) values_vec(sc, vc, tab, len, G, D, BS, row, oh, scattered);
        else values_scalar(sc, vc, tab, len, G, D, BS, row, oh);
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
