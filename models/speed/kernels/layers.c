/* An int8 decoder's blocks for one token, in one call: what models/speed/cpu.py's _cpu_step does per layer with
 * ~25 numpy calls between its 4 products (RMSNorm, the qkv product, RoPE of q and k, the cache write, one-query
 * grouped-query attention, the o product into x, RMSNorm, the gate/up product, SiLU * up, the down product into x),
 * so that a step pays one call from Python instead of ~30 per layer (measured: bench/notes/int8.md). The products
 * are gemv.c's gemv_i8 (its helper threads share the large ones); the rest runs on the calling thread in float32,
 * the arithmetic of the numpy step up to the order of the additions.
 * Built with gemv.c into one library by models/speed/narrow.py.
 *
 * Notation: C model dim, H query heads, Hkv key/value heads, g = H / Hkv, D head dim, F feed-forward dim,
 * S_max a layer's cache length. */
#include <math.h>
#include <stdint.h>
#include <immintrin.h>

void gemv_i8(const float *x, const int8_t *q, const float *scale, float *out, int64_t rows, int64_t cols,
             float alpha, int accumulate, int threads);
int narrow_simd(void);

static float dot_c(const float *a, const float *b, int64_t n) {
    float r = 0.0f;
    for (int64_t i = 0; i < n; i++) r += a[i] * b[i];
    return r;
}

/* a score is a 64-long dot product: scalar code would cost more than the numpy call it replaces */
__attribute__((target("avx2,fma")))
static float dot_avx2(const float *a, const float *b, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    __m256 s = _mm256_add_ps(s0, s1);
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    t = _mm_add_ps(t, _mm_movehl_ps(t, t));
    t = _mm_add_ss(t, _mm_shuffle_ps(t, t, 1));
    return _mm_cvtss_f32(t) + dot_c(a + i, b + i, n - i);
}

static float dot(const float *a, const float *b, int64_t n, int simd) {
    return simd ? dot_avx2(a, b, n) : dot_c(a, b, n);
}

/* out = rotate(x): output j < D/2 is x[j] cos[j] - x[j + D/2] sin[j], j >= D/2 is x[j] cos[j] + x[j - D/2] sin[j]
 * (rotate_half's pairing, models.rope.rope_matrix's coefficients), times mul */
static void rope(const float *x, const float *cos, const float *sin, float *out, int64_t D, float mul) {
    int64_t half = D / 2;
    for (int64_t j = 0; j < half; j++) {
        out[j] = (x[j] * cos[j] - x[j + half] * sin[j]) * mul;
        out[j + half] = (x[j + half] * cos[j + half] + x[j] * sin[j + half]) * mul;
    }
}

/* h = x * weight; returns RMSNorm's 1 / sqrt(mean(x^2) + eps), which the next product takes as its alpha */
static float norm(const float *x, const float *weight, double eps, float *h, int64_t C, int simd) {
    for (int64_t i = 0; i < C; i++) h[i] = x[i] * weight[i];
    return (float)(1.0 / sqrt((double)dot(x, x, C, simd) / (double)C + eps));
}

/* One layer's tensors by address, a row of int64 per layer in this order (models/speed/cpu.py fills them): its
 * weights (made once per model) and its cache (once per generation). */
enum { NORM1, QKV_Q, QKV_S, O_Q, O_S, NORM2, GU_Q, GU_S, DOWN_Q, DOWN_S, FIELDS };
enum { K_CACHE, V_CACHE, S_MAX, CACHE_FIELDS };

/* x (C,) is the residual stream, updated in place through every layer; w (layers, FIELDS) the layers' weights,
 * cache (layers, CACHE_FIELDS) their keys and values ((Hkv, S_max, D) fp32 each, batch row 0); eps (layers, 2) the
 * norms' eps; cos, sin (D,) this position's RoPE tables; scratch at least C + (H + 2 Hkv) D + H D + 3 F + pos + 1
 * floats. */
void int8_layers(float *x, const int64_t *w, const int64_t *cache, const double *eps, int64_t layers, int64_t pos,
                 const float *cos, const float *sin, int64_t C, int64_t H, int64_t Hkv, int64_t D, int64_t F,
                 float *scratch, int threads) {
    int simd = narrow_simd();
    int64_t g = H / Hkv, QKV = (H + 2 * Hkv) * D;
    float *h = scratch, *qkv = h + C, *z = qkv + QKV, *gu = z + H * D, *act = gu + 2 * F, *p = act + F;
    float qr[D > 0 ? D : 1];
    float scale = 1.0f / sqrtf((float)D);
    for (int64_t l = 0; l < layers; l++) {
        const int64_t *t = w + l * FIELDS, *c = cache + l * CACHE_FIELDS;
        int64_t s_max = c[S_MAX];
        float *keys = (float *)c[K_CACHE], *values = (float *)c[V_CACHE];
        float a = norm(x, (const float *)t[NORM1], eps[2 * l], h, C, simd);
        gemv_i8(h, (const int8_t *)t[QKV_Q], (const float *)t[QKV_S], qkv, QKV, C, a, 0, threads);
        for (int64_t kv = 0; kv < Hkv; kv++) {  /* the cache write: the key RoPE'd, the value as it is */
            float *k_at = keys + (kv * s_max + pos) * D, *v_at = values + (kv * s_max + pos) * D;
            rope(qkv + (H + kv) * D, cos, sin, k_at, D, 1.0f);
            for (int64_t d = 0; d < D; d++) v_at[d] = qkv[(H + Hkv + kv) * D + d];
        }
        for (int64_t head = 0; head < H; head++) {  /* query head `head` reads key/value head head / g */
            const float *k = keys + (head / g) * s_max * D, *v = values + (head / g) * s_max * D;
            float *zh = z + head * D;
            rope(qkv + head * D, cos, sin, qr, D, scale);  /* the attention's 1/sqrt(D) folded into the query */
            float top = -INFINITY, sum = 0.0f;
            for (int64_t s = 0; s <= pos; s++) {
                p[s] = dot(qr, k + s * D, D, simd);
                top = p[s] > top ? p[s] : top;
            }
            for (int64_t s = 0; s <= pos; s++) {
                p[s] = expf(p[s] - top);
                sum += p[s];
            }
            for (int64_t d = 0; d < D; d++) zh[d] = 0.0f;
            for (int64_t s = 0; s <= pos; s++) {  /* softmax-weighted values; the row's sum divided in once */
                float ps = p[s] / sum;
                const float *vs = v + s * D;
                for (int64_t d = 0; d < D; d++) zh[d] += ps * vs[d];
            }
        }
        gemv_i8(z, (const int8_t *)t[O_Q], (const float *)t[O_S], x, C, H * D, 1.0f, 1, threads);
        a = norm(x, (const float *)t[NORM2], eps[2 * l + 1], h, C, simd);
        gemv_i8(h, (const int8_t *)t[GU_Q], (const float *)t[GU_S], gu, 2 * F, C, a, 0, threads);
        for (int64_t i = 0; i < F; i++)  /* silu(gate) * up; exp(-gate) is inf below -88, and gate / inf is 0 */
            act[i] = gu[i] / (1.0f + expf(-gu[i])) * gu[F + i];
        gemv_i8(act, (const int8_t *)t[DOWN_Q], (const float *)t[DOWN_S], x, C, F, 1.0f, 1, threads);
    }
}
