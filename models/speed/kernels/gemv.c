/* The one-row product of an int8 weight: out[o] = (accumulate ? out[o] : 0) + alpha * scale[o] * (Q[o, :] . x),
 * Q an (rows, cols) row-major int8 matrix, scale (rows,), x and out fp32.
 * Each weight is widened to fp32 in registers and multiplied in fp32, so the result is the fp32 dot product of the
 * widened weight up to the order of the additions; only the weight's own bytes are read from memory.
 * Built and loaded by models/speed/narrow.py; a large matrix's rows are shared among torch's OpenMP threads
 * (torch's own libgomp, already loaded when this library is). AVX2 + FMA where the CPU has them, portable C elsewhere. */
#include <stdint.h>
#include <immintrin.h>

static float dot_i8_c(const int8_t *q, const float *x, int64_t n) {
    float r = 0.0f;
    for (int64_t i = 0; i < n; i++) r += (float)q[i] * x[i];
    return r;
}

__attribute__((target("avx2,fma")))
static float hsum(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    t = _mm_add_ps(t, _mm_movehl_ps(t, t));
    t = _mm_add_ss(t, _mm_shuffle_ps(t, t, 1));
    return _mm_cvtss_f32(t);
}

/* four accumulators: one FMA chain would wait on its own latency every 8 weights */
__attribute__((target("avx2,fma")))
static float dot_i8_avx2(const int8_t *q, const float *x, int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {  /* each 8 weights loaded and sign-extended by one instruction (vpmovsxbd) */
#define WIDEN(k) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + i + (k)))))
        a0 = _mm256_fmadd_ps(WIDEN(0), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(WIDEN(8), _mm256_loadu_ps(x + i + 8), a1);
        a2 = _mm256_fmadd_ps(WIDEN(16), _mm256_loadu_ps(x + i + 16), a2);
        a3 = _mm256_fmadd_ps(WIDEN(24), _mm256_loadu_ps(x + i + 24), a3);
#undef WIDEN
    }
    return hsum(a0, a1, a2, a3) + dot_i8_c(q + i, x + i, n - i);
}

/* Below this many weights a matrix is read by one thread: waking a second one for each of a step's ~150 small
 * products cost more than it saved on a busy 2-core machine (bench/notes/int8.md). */
#define PARALLEL_MIN_WEIGHTS (1 << 21)

static int has_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

int narrow_simd(void) { return has_avx2(); }

void gemv_i8(const float *x, const int8_t *q, const float *scale, float *out, int64_t rows, int64_t cols,
             float alpha, int accumulate, int threads) {
    int simd = has_avx2();
    int shared = threads > 1 && rows * cols >= PARALLEL_MIN_WEIGHTS;
    #pragma omp parallel for schedule(static) num_threads(threads) if(shared)
    for (int64_t o = 0; o < rows; o++) {
        const int8_t *row = q + o * cols;
        float v = alpha * scale[o] * (simd ? dot_i8_avx2(row, x, cols) : dot_i8_c(row, x, cols));
        out[o] = accumulate ? out[o] + v : v;
    }
}
