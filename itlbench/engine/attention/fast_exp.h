/* exp(x) shared by paged_decode.c (softmax) and row_ops.c (SiLU): 2^n * poly(r) with |r| <= ln2 / 2,
 * ~1 ulp, clamped to float's range. Written without libm so that loops over rows vectorize; n comes
 * from rint, which has a vector instruction (round would not, and the loops would run scalar). */
#ifndef ITL_FAST_EXP_H
#define ITL_FAST_EXP_H
#include <stdint.h>

static inline float fast_exp(float x)
{
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    const float n = __builtin_rintf(x * 1.44269504088896341f);
    const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union { float f; int32_t i; } u = {.f = p};
    u.i += (int32_t)n << 23;
    return u.f;
}

#endif
