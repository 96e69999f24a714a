/* exp(x) shared by paged_decode.c (softmax) and row_ops.c (SiLU): 2^n * poly(r) with |r| <= ln2 / 2,
 * ~1 ulp, clamped to float's range. Written without libm so that loops over rows vectorize; n comes
 * from rint, which has a vector instruction (round would not, and the loops would run scalar). */
#ifndef ITL_FAST_EXP_H
#define ITL_FAST_EXP_H
#include <stdint.h>

/* The steps, shared with the vector form in paged_decode.c: r = x - n ln2 (ln2 in two parts), then
 * exp(r) by a degree-6 polynomial. */
#define ITL_LOG2E 1.44269504088896341f
#define ITL_EXP_REDUCE(x, n) ((x) - (n) * 0.693359375f + (n) * 2.12194440e-4f)
#define ITL_EXP_POLY(r)                                                                             \
    ((((((1.9875691500e-4f * (r) + 1.3981999507e-3f) * (r) + 8.3334519073e-3f) * (r) +               \
        4.1665795894e-2f) * (r) + 1.6666665459e-1f) * (r) + 5.0000001201e-1f) * (r) * (r) + (r) + 1.0f)

static inline float fast_exp(float x)
{
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    const float n = __builtin_rintf(x * ITL_LOG2E);
    const float r = ITL_EXP_REDUCE(x, n);
    union { float f; int32_t i; } u = {.f = ITL_EXP_POLY(r)};
    u.i += (int32_t)n << 23;
    return u.f;
}

#endif
