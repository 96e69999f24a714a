/* A whole decode step's decoder stack in one call: every layer's norms, products, RoPE, K/V write and
 * attention, in the order llama.py runs them, through the same C operators.
 *
 * In Python each of a layer's dozen operators costs a few microseconds of interpreter and ctypes
 * overhead on top of its arithmetic; at cpu-small's size that was ~0.7 ms of a 5.4 ms batch-32 step.
 * Here the step pays it once. The operators and their order are llama.py's, so the hidden states are
 * bit-for-bit those of the module path (each output element is accumulated by one thread in a fixed
 * order in every operator, whatever the thread count).
 *
 * The step's own inputs come in as token ids and positions: the embedding rows and rotary angles are
 * gathered here (each was a torch indexing call of ~30-60 µs in a step whose Python ran on caches the
 * forward had just flushed), and the greedy token of each row is taken beside the LM head (numpy's
 * argmax over a batch-32 x 8k vocabulary cost ~0.12 ms there).
 *
 * Layout: logits [n, vocab] gets the LM head's output (every decode row samples). Row i is decode row
 * i: rows[i] == i, its K/V goes to slots[i]. The residual stream, the final norm's output and the
 * gathered angles live in the workspace.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

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

/* What every step reads besides the layers: the embedding table [vocab, d], the rotary tables
 * [positions, head_dim / 2], the final norm and the LM head (in panels, `vocab` columns). */
typedef struct {
    const float *embed, *cos, *sin, *final_norm, *lm_head;
    int64_t vocab;
} itl_model_t;

/* One step: n decode rows, their token ids, positions, K/V slots and attention tables; the outputs. */
typedef struct {
    int64_t n;
    const int64_t *ids, *positions, *rows, *slots;
    const int32_t *tables, *lens;
    int64_t table_stride;
    float *logits;
    int64_t *greedy; /* [n]: each row's first maximum (numpy's argmax: the first NaN if there is one) */
} itl_step_t;

/* Workspace floats for n rows (what decode_forward.py allocates). */
int64_t itl_decode_workspace(const itl_shape_t *s, int64_t n)
{
    const int64_t qkv = (s->heads + 2 * s->kv_heads) * s->head_dim;
    return n * (4 * s->d + qkv + s->heads * s->head_dim + 3 * s->inter + s->head_dim);
}

static void gather_rows(const float *table, int64_t width, const int64_t *idx, float *out, int64_t n)
{
    for (int64_t i = 0; i < n; i++) memcpy(out + i * width, table + idx[i] * width, (size_t)width * sizeof(float));
}

void itl_argmax_rows_f32(const float *logits, int64_t n, int64_t V, int64_t *out, int64_t threads)
{
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && n > 1)
    for (int64_t i = 0; i < n; i++) {
        const float *row = logits + i * V;
        float mx = -INFINITY;
        int nan = 0;
#pragma omp simd reduction(max : mx) reduction(| : nan)
        for (int64_t j = 0; j < V; j++) {
            mx = row[j] > mx ? row[j] : mx;
            nan |= row[j] != row[j];
        }
        int64_t k = 0;
        if (nan) while (row[k] == row[k]) k++;
        else while (k < V - 1 && row[k] != mx) k++;
        out[i] = k;
    }
}

/* Returns 0, or -1 when a context is longer than the attention scratch allows (as paged_decode). */
int itl_decode_forward_f32(const itl_layer_t *layer, const itl_shape_t *s, const itl_model_t *m, const itl_step_t *st,
                           float *work, float *attn_scratch, int64_t scratch_per_thread, int64_t threads)
{
    const int64_t n = st->n, d = s->d, H = s->heads, KVH = s->kv_heads, D = s->head_dim, I = s->inter;
    const int64_t qkv_w = (H + 2 * KVH) * D;
    float *x = work, *hidden = x + n * d, *h = hidden + n * d, *delta = h + n * d, *qkv = delta + n * d,
          *attn = qkv + n * qkv_w, *gate_up = attn + n * H * D, *act = gate_up + n * 2 * I, *cos_t = act + n * I,
          *sin_t = cos_t + n * (D / 2);
    gather_rows(m->embed, d, st->ids, x, n);
    gather_rows(m->cos, D / 2, st->positions, cos_t, n);
    gather_rows(m->sin, D / 2, st->positions, sin_t, n);
    int first = 1;
    for (int64_t l = 0; l < s->layers; l++, layer++) {
        itl_add_rms_norm_f32(x, first ? 0 : delta, layer->attn_norm, h, n, d, s->eps, threads);
        first = 0;
        itl_gemm_f32(h, d, layer->qkv, qkv, qkv_w, n, qkv_w, d, threads);
        itl_rope_f32(qkv, qkv_w, cos_t, sin_t, n, H + KVH, D, threads);
        itl_write_kv_f32(qkv + H * D, qkv_w, qkv + (H + KVH) * D, qkv_w, layer->k_cache, layer->v_cache, st->slots,
                         n, KVH * D);
        if (itl_paged_decode_f32(qkv, qkv_w, st->rows, layer->k_cache, layer->v_cache, st->tables, st->table_stride,
                                 st->lens, attn, H * D, n, H, KVH, D, s->block_size, s->scale, attn_scratch,
                                 scratch_per_thread, threads) != 0)
            return -1;
        itl_gemm_f32(attn, H * D, layer->o, delta, d, n, d, H * D, threads);
        itl_add_rms_norm_f32(x, delta, layer->mlp_norm, h, n, d, s->eps, threads);
        itl_gemm_f32(h, d, layer->gate_up, gate_up, 2 * I, n, 2 * I, d, threads);
        itl_silu_mul_f32(gate_up, act, n, I, threads);
        itl_gemm_f32(act, I, layer->down, delta, d, n, d, I, threads);
    }
    itl_add_rms_norm_f32(x, first ? 0 : delta, m->final_norm, hidden, n, d, s->eps, threads);
    itl_gemm_f32(hidden, d, m->lm_head, st->logits, m->vocab, n, m->vocab, d, threads);
    itl_argmax_rows_f32(st->logits, n, m->vocab, st->greedy, threads);
    return 0;
}
