/* A whole decode step's decoder stack in one call: every layer's norms, products, RoPE, K/V write and
 * attention, in the order llama.py runs them, through the same C operators.
 *
 * In Python each of a layer's dozen operators costs a few microseconds of interpreter and ctypes
 * overhead on top of its arithmetic; at cpu-small's size that was ~0.7 ms of a 5.4 ms batch-32 step.
 * Here the step pays it once. The operators and their order are llama.py's, so the hidden states are
 * bit-for-bit those of the module path (each output element is accumulated by one thread in a fixed
 * order in every operator, whatever the thread count).
 *
 * Layout: x [n, d] holds the step's embeddings and becomes the residual stream; hidden [n, d] gets
 * the final norm's output and logits [n, vocab] the LM head's (every decode row samples). Row i is
 * decode row i: rows[i] == i, its K/V goes to slots[i].
 */
#include <stdint.h>

/* The operators, from row_ops.c, panel_gemm.c and paged_decode.c. */
void itl_add_rms_norm_f32(float *residual, const float *delta, const float *weight, float *out, int64_t n,
                          int64_t d, float eps, int64_t num_threads);
void itl_rope_f32(float *x, int64_t row_stride, const float *cos_t, const float *sin_t, int64_t n, int64_t heads,
                  int64_t D, int64_t num_threads);
void itl_silu_mul_f32(const float *gate_up, float *out, int64_t n, int64_t inter, int64_t num_threads);
void itl_gemm_f32(const float *x, int64_t xs, const float *panels, float *out, int64_t os, int64_t M, int64_t N,
                  int64_t K, int64_t num_threads);
int itl_paged_decode_f32(const float *q, int64_t q_row_stride, const int64_t *rows, const float *k_cache,
                         const float *v_cache, const int32_t *tables, int64_t table_stride, const int32_t *lens,
                         float *out, int64_t out_row_stride, int64_t n, int64_t H, int64_t KVH, int64_t D, int64_t BS,
                         float scale, float *scratch, int64_t scratch_per_thread, int64_t num_threads);
void itl_write_kv_f32(const float *k, int64_t k_row_stride, const float *v, int64_t v_row_stride, float *k_cache,
                      float *v_cache, const int64_t *slot_mapping, int64_t n, int64_t row);

/* One layer's weights (norms as vectors, projections as panels) and its K/V caches. */
typedef struct {
    const float *attn_norm, *qkv, *o, *mlp_norm, *gate_up, *down;
    float *k_cache, *v_cache;
} itl_layer_t;

typedef struct {
    int64_t layers, d, heads, kv_heads, head_dim, inter, block_size;
    float eps, scale;
} itl_shape_t;

/* Workspace floats for n rows (what decode_forward.py allocates). */
int64_t itl_decode_workspace(const itl_shape_t *s, int64_t n)
{
    const int64_t qkv = (s->heads + 2 * s->kv_heads) * s->head_dim;
    return n * (2 * s->d + qkv + s->heads * s->head_dim + 3 * s->inter);
}

/* Returns 0, or -1 when a context is longer than the attention scratch allows (as paged_decode). */
int itl_decode_forward_f32(const itl_layer_t *layer, const itl_shape_t *s, const float *final_norm,
                           const float *lm_head, int64_t vocab, float *x, float *hidden, float *logits, int64_t n, const float *cos_t, const float *sin_t, const int64_t *rows,
                           const int64_t *slots, const int32_t *tables, int64_t table_stride, const int32_t *lens,
                           float *work, float *attn_scratch, int64_t scratch_per_thread, int64_t threads)
{
    const int64_t d = s->d, H = s->heads, KVH = s->kv_heads, D = s->head_dim, I = s->inter;
    const int64_t qkv_w = (H + 2 * KVH) * D;
    float *h = work, *delta = h + n * d, *qkv = delta + n * d, *attn = qkv + n * qkv_w, *gate_up = attn + n * H * D,
          *act = gate_up + n * 2 * I;
    int first = 1;
    for (int64_t l = 0; l < s->layers; l++, layer++) {
        itl_add_rms_norm_f32(x, first ? 0 : delta, layer->attn_norm, h, n, d, s->eps, threads);
        first = 0;
        itl_gemm_f32(h, d, layer->qkv, qkv, qkv_w, n, qkv_w, d, threads);
        itl_rope_f32(qkv, qkv_w, cos_t, sin_t, n, H + KVH, D, threads);
        itl_write_kv_f32(qkv + H * D, qkv_w, qkv + (H + KVH) * D, qkv_w, layer->k_cache, layer->v_cache, slots, n,
                         KVH * D);
        if (itl_paged_decode_f32(qkv, qkv_w, rows, layer->k_cache, layer->v_cache, tables, table_stride, lens, attn,
                                 H * D, n, H, KVH, D, s->block_size, s->scale, attn_scratch, scratch_per_thread,
                                 threads) != 0)
            return -1;
        itl_gemm_f32(attn, H * D, layer->o, delta, d, n, d, H * D, threads);
        itl_add_rms_norm_f32(x, delta, layer->mlp_norm, h, n, d, s->eps, threads);
        itl_gemm_f32(h, d, layer->gate_up, gate_up, 2 * I, n, 2 * I, d, threads);
        itl_silu_mul_f32(gate_up, act, n, I, threads);
        itl_gemm_f32(act, I, layer->down, delta, d, n, d, I, threads);
    }
    itl_add_rms_norm_f32(x, first ? 0 : delta, final_norm, hidden, n, d, s->eps, threads);
    itl_gemm_f32(hidden, d, lm_head, logits, vocab, n, vocab, d, threads);
    return 0;
}
