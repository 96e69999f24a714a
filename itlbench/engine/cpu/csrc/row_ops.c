/* The row-wise operators between a decoder layer's matrix products, each fused into one pass.
 *
 * In a decode step of a small model every one of these runs on a few rows of a few hundred floats, so
 * torch's cost is dispatch and temporaries, not arithmetic: RMSNorm alone is six aten calls. One C
 * call per operator does the same arithmetic (float accumulation, as torch's fp32 kernels do) in a
 * single pass, in place where the layer allows. Built into the same library as paged_decode.c.
 *
 * Layout: rows of `d` (or 2 * inter) contiguous floats, row strides given where a view is passed.
 */
#include <math.h>
#include <stdint.h>

#include "fast_exp.h"
#ifdef _OPENMP
#include <omp.h>
#endif

/* Rows per thread below which the work is too small to share (an OpenMP fork costs microseconds). */
#define ROWS_PER_THREAD 64

/* residual += delta (when delta is given), then out = residual / rms(residual) * weight. */
void itl_add_rms_norm_f32(float *restrict residual, const float *restrict delta, const float *restrict weight,
                          float *restrict out, int64_t n, int64_t d, float eps, int64_t num_threads)
{
#pragma omp parallel for schedule(static) num_threads(num_threads) if (n >= 2 * ROWS_PER_THREAD)
    for (int64_t i = 0; i < n; i++) {
        float *restrict x = residual + i * d;
        float *restrict o = out + i * d;
        float ss = 0.0f;
        if (delta) {
            const float *restrict dl = delta + i * d;
#pragma omp simd reduction(+ : ss)
            for (int64_t j = 0; j < d; j++) {
                x[j] += dl[j];
                ss += x[j] * x[j];
            }
        } else {
#pragma omp simd reduction(+ : ss)
            for (int64_t j = 0; j < d; j++) ss += x[j] * x[j];
        }
        const float inv = 1.0f / sqrtf(ss / (float)d + eps);
#pragma omp simd
        for (int64_t j = 0; j < d; j++) o[j] = x[j] * inv * weight[j];
    }
}

/* Rotate, in place, the first `heads` heads of each row (Hugging Face Llama layout: the two halves of
 * a head are the pair) by the row's angles: cos/sin are [n, D/2], already gathered for its position. */
void itl_rope_f32(float *restrict x, int64_t row_stride, const float *restrict cos_t, const float *restrict sin_t,
                  int64_t n, int64_t heads, int64_t D, int64_t num_threads)
{
    const int64_t half = D / 2;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (n >= 2 * ROWS_PER_THREAD)
    for (int64_t i = 0; i < n; i++) {
        const float *restrict c = cos_t + i * half, *restrict s = sin_t + i * half;
        for (int64_t h = 0; h < heads; h++) {
            float *restrict a = x + i * row_stride + h * D, *restrict b = a + half;
#pragma omp simd
            for (int64_t j = 0; j < half; j++) {
                const float x1 = a[j], x2 = b[j];
                a[j] = x1 * c[j] - x2 * s[j];
                b[j] = x2 * c[j] + x1 * s[j];
            }
        }
    }
}

/* out[i, j] = silu(gate_up[i, j]) * gate_up[i, inter + j]: SwiGLU's gate and up halves of one product. */
void itl_silu_mul_f32(const float *restrict gate_up, float *restrict out, int64_t n, int64_t inter,
                      int64_t num_threads)
{
#pragma omp parallel for schedule(static) num_threads(num_threads) if (n >= 2 * ROWS_PER_THREAD)
    for (int64_t i = 0; i < n; i++) {
        const float *restrict g = gate_up + i * 2 * inter, *restrict u = g + inter;
        float *restrict o = out + i * inter;
#pragma omp simd
        for (int64_t j = 0; j < inter; j++) o[j] = g[j] / (1.0f + fast_exp(-g[j])) * u[j];
    }
}
