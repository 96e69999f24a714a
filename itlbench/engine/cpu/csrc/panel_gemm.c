/* out = x @ W^T for the few rows of a decode step, with W pre-packed in column panels.
 *
 * At 1-64 rows a step's products are too thin for a BLAS: MKL re-packs W on every call and oneDNN
 * spends ~12 µs per call before multiplying, and both then read W from memory that the step's K/V
 * stream has just evicted. Here W is packed once, at load, into panels of NR output columns laid out
 * [K][NR], so a product streams each panel front to back exactly once from memory and re-reads it
 * from L1/L2 for every MR-row tile. The tile keeps MR x NV vector accumulators in registers: per k it
 * loads NV vectors of W, broadcasts MR values of x and issues MR * NV FMAs.
 *
 * Layout:  x [M, K] (row stride given, K contiguous), out [M, N] (row stride given)
 *          panels [ceil(N / NR)][K][NR], zero-padded past column N
 * Work items are (panel, block of rows) pairs, shared over the OpenMP pool torch's own ops use.
 */
#include <stdint.h>

#ifdef _OPENMP
#include <omp.h>
#endif

/* Vector width as in paged_decode.c (ITL_PREFER_256 on AMD family 19h). */
#if defined(__AVX512F__) && !defined(ITL_PREFER_256)
#define GW 16
#elif defined(__AVX__)
#define GW 8
#else
#define GW 4
#endif

/* 6 x 4 accumulators need 24 + 4 + 1 vector registers: targets with 32 (AVX-512, also at 256 bits;
 * AArch64). With 16 (AVX2, SSE), 4 x 3 uses all of them. Measured on a 2-core AMD EPYC box, 32 rows
 * of a 1536 x 256 weight, two threads: 122 µs for 6 x 4, 176 µs for 4 x 3. */
#if defined(__AVX512F__) || defined(__aarch64__)
#define MR 6
#define NV 4
#else
#define MR 4
#define NV 3
#endif
#define NR (NV * GW)
#define ROW_BLOCK (8 * MR) /* rows per work item: enough to reuse a panel from L1, few enough to share */

typedef float gv __attribute__((vector_size(GW * 4)));
typedef float gv_unaligned __attribute__((vector_size(GW * 4), aligned(4), may_alias));

int64_t itl_gemm_panel_width(void) { return NR; }

/* rows [0, mr) of one panel; `cols` < NR only in the last panel. */
static inline __attribute__((always_inline)) void tile(const float *restrict x, int64_t xs,
                                                       const float *restrict panel, float *restrict out,
                                                       int64_t os, int64_t K, int mr, int64_t cols)
{
    gv acc[MR][NV];
    for (int r = 0; r < MR; r++)
        for (int j = 0; j < NV; j++) acc[r][j] = (gv){0};
    for (int64_t k = 0; k < K; k++) {
        gv w[NV];
        for (int j = 0; j < NV; j++) w[j] = *(const gv_unaligned *)(panel + k * NR + j * GW);
        for (int r = 0; r < mr; r++) {
            const float xv = x[r * xs + k];
            for (int j = 0; j < NV; j++) acc[r][j] += xv * w[j];
        }
    }
    if (cols == NR) {
        for (int r = 0; r < mr; r++)
            for (int j = 0; j < NV; j++) *(gv_unaligned *)(out + r * os + j * GW) = acc[r][j];
    } else {
        for (int r = 0; r < mr; r++)
            for (int64_t c = 0; c < cols; c++) out[r * os + c] = acc[r][c / GW][c % GW];
    }
}

/* The rows left after the last full tile, with mr a compile-time constant in each case. */
static void tail(const float *x, int64_t xs, const float *panel, float *out, int64_t os, int64_t K, int64_t mr,
                 int64_t cols)
{
    switch (mr) {
    case 1: tile(x, xs, panel, out, os, K, 1, cols); break;
    case 2: tile(x, xs, panel, out, os, K, 2, cols); break;
    case 3: tile(x, xs, panel, out, os, K, 3, cols); break;
#if MR > 4
    case 4: tile(x, xs, panel, out, os, K, 4, cols); break;
    case 5: tile(x, xs, panel, out, os, K, 5, cols); break;
#endif
    default: break;
    }
}

void itl_gemm_f32(const float *x, int64_t xs, const float *panels, float *out, int64_t os, int64_t M, int64_t N,
                  int64_t K, int64_t num_threads)
{
    const int64_t P = (N + NR - 1) / NR, B = (M + ROW_BLOCK - 1) / ROW_BLOCK, items = P * B;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1 && items > 1)
    for (int64_t it = 0; it < items; it++) {
        const int64_t p = it / B, m0 = (it % B) * ROW_BLOCK;
        const int64_t m1 = M - m0 < ROW_BLOCK ? M : m0 + ROW_BLOCK;
        const int64_t cols = N - p * NR < NR ? N - p * NR : NR;
        const float *panel = panels + p * K * NR;
        int64_t m = m0;
        for (; m + MR <= m1; m += MR) tile(x + m * xs, xs, panel, out + m * os + p * NR, os, K, MR, cols);
        if (m < m1) tail(x + m * xs, xs, panel, out + m * os + p * NR, os, K, m1 - m, cols);
    }
}
