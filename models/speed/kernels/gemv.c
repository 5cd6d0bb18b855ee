/* The one-row product of an int8 weight: out[o] = (accumulate ? out[o] : 0) + alpha * scale[o] * (Q[o, :] . x),
 * Q an (rows, cols) row-major int8 matrix, scale (rows,), x and out fp32.
 * Each int8 weight is widened to fp32 in registers and multiplied in fp32, so the result is the fp32 dot product of
 * the widened weight up to the order of the additions; only the weight's own bytes are read from memory.
 * Built and loaded by models/speed/narrow.py. AVX2 + FMA where the CPU has them, portable C elsewhere.
 *
 * Threads: a large product's rows are cut into chunks that the caller and up to threads - 1 helper threads (made
 * here on first use, sleeping when idle) claim one at a time from a shared counter. The caller never waits for a
 * helper that has not claimed a chunk: on a busy machine a descheduled helper costs nothing, where an OpenMP
 * barrier waited a whole time slice for it (bench/notes/int8.md). Every row is computed by the same code whichever
 * thread runs it, so the result does not depend on the number of threads. */
#include <stdint.h>
#include <stdatomic.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>
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

/* A row is shorter than the hardware prefetcher's ramp: asking for the line 2 KB ahead (a few rows on) streamed
 * a step's int8 weights at 13.4-14.5 GB/s instead of 12.0-13.1 on one thread of the 2-core AMD EPYC. */
#define PREFETCH_BYTES 2048

/* four accumulators: one FMA chain would wait on its own latency every 8 weights */
__attribute__((target("avx2,fma")))
static float dot_i8_avx2(const int8_t *q, const float *x, int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {  /* each 8 weights loaded and sign-extended by one instruction (vpmovsxbd) */
        if (!(i & 32)) _mm_prefetch((const char *)(q + i + PREFETCH_BYTES), _MM_HINT_T0);
#define WIDEN(k) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + i + (k)))))
        a0 = _mm256_fmadd_ps(WIDEN(0), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(WIDEN(8), _mm256_loadu_ps(x + i + 8), a1);
        a2 = _mm256_fmadd_ps(WIDEN(16), _mm256_loadu_ps(x + i + 16), a2);
        a3 = _mm256_fmadd_ps(WIDEN(24), _mm256_loadu_ps(x + i + 24), a3);
#undef WIDEN
    }
    return hsum(a0, a1, a2, a3) + dot_i8_c(q + i, x + i, n - i);
}

static int simd_here = -1;

int narrow_simd(void) {
    if (simd_here < 0) {
        __builtin_cpu_init();
        simd_here = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    return simd_here;
}

typedef struct {
    const float *x;
    const int8_t *q;
    const float *scale;
    float *out;
    int64_t rows, cols, chunk, chunks;
    float alpha;
    int accumulate, simd, helpers;
} Job;

static void run_rows(const Job *j, int64_t start, int64_t stop) {
    for (int64_t o = start; o < stop; o++) {
        const int8_t *row = j->q + o * j->cols;
        float v = j->alpha * j->scale[o] * (j->simd ? dot_i8_avx2(row, j->x, j->cols) : dot_i8_c(row, j->x, j->cols));
        j->out[o] = j->accumulate ? j->out[o] + v : v;
    }
}

/* Below this many weights a product is read by the caller alone: handing it out costs more than it saves. */
#define SHARED_MIN_WEIGHTS (1 << 16)
/* Weights per claimed chunk: small enough that a helper descheduled mid-chunk holds little, large enough that
 * the shared counter is touched once per few microseconds. */
#define CHUNK_WEIGHTS (1 << 14)
#define MAX_HELPERS 15
#define CLOSED 0xffffffffu
/* How long an idle helper spins before it sleeps: longer than the numpy work between two products of a step. */
#define SPIN_NS 300000
/* A caller that waited for a helper's chunk (the helper was descheduled: the machine is busy) computes the next
 * products alone, one for each NS_PER_ALONE_CALL it waited (a 3 ms time slice: 300 products, about two decode
 * steps), so that waiting never costs much more than sharing saves (~10 us a product); then it shares again. */
#define NS_PER_ALONE_CALL 10000
/* Helpers that computed under a tenth of the chunks of the last WINDOW shared products were rarely given a core (a
 * busy machine): their spinning only took time from the caller, so the next ALONE_CALLS products (about ten steps)
 * run on the caller alone while the helpers sleep. */
#define WINDOW 64
#define ALONE_CALLS 1500

static Job job;  /* written only by the caller that owns it, while no helper is busy */
static _Atomic uint64_t ticket;  /* (generation << 32) | next chunk; chunk CLOSED: nothing to claim */
static _Atomic int busy;  /* helpers between reading the ticket and finishing their chunks */
static _Atomic int sleepers;
static atomic_flag owner = ATOMIC_FLAG_INIT;  /* one caller at a time hands out work; others compute alone */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static int started;  /* helper threads made (only the owner touches it) */
static int fork_hook;
static _Atomic int64_t calls, alone_until;  /* products handed out so far; before alone_until: no sharing */
static _Atomic int64_t helped;  /* chunks computed by helpers since the library was loaded */
static int64_t window_products, window_chunks, window_helped;  /* owner only: the last shared products' tally */

int64_t narrow_helped(void) { return atomic_load(&helped); }

static int claim(uint32_t gen, int64_t chunks, int64_t *index) {
    uint64_t t = atomic_load(&ticket);
    for (;;) {
        uint32_t next = (uint32_t)t;
        if ((uint32_t)(t >> 32) != gen || next == CLOSED || next >= chunks) return 0;
        if (atomic_compare_exchange_weak(&ticket, &t, t + 1)) {
            *index = next;
            return 1;
        }
    }
}

static void run_chunk(const Job *j, int64_t c) {
    int64_t start = c * j->chunk, stop = start + j->chunk;
    run_rows(j, start, stop < j->rows ? stop : j->rows);
}

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void pause_once(void) {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#endif
}

static void *helper(void *arg) {
    int id = (int)(intptr_t)arg;
    uint32_t seen = (uint32_t)(atomic_load(&ticket) >> 32);
    int64_t idle_since = now_ns();
    for (unsigned spins = 0;; spins++) {
        if ((uint32_t)(atomic_load(&ticket) >> 32) != seen) {
            atomic_fetch_add(&busy, 1);  /* announced before the ticket is read again: the caller waits for us */
            uint64_t t = atomic_load(&ticket);
            seen = (uint32_t)(t >> 32);
            if ((uint32_t)t != CLOSED) {  /* open: the job's fields are this generation's and stay so while busy */
                Job j = job;
                int64_t c;
                if (id < j.helpers)
                    while (claim(seen, j.chunks, &c)) {
                        run_chunk(&j, c);
                        atomic_fetch_add_explicit(&helped, 1, memory_order_relaxed);
                    }
            }
            atomic_fetch_sub(&busy, 1);
            idle_since = now_ns();
            continue;
        }
        pause_once();
        if ((spins & 255) == 0 && now_ns() - idle_since > SPIN_NS) {
            pthread_mutex_lock(&lock);
            atomic_fetch_add(&sleepers, 1);
            while ((uint32_t)(atomic_load(&ticket) >> 32) == seen) pthread_cond_wait(&wake, &lock);
            atomic_fetch_sub(&sleepers, 1);
            pthread_mutex_unlock(&lock);
        }
    }
    return NULL;
}

/* A forked child has none of its parent's helper threads: it starts with none, and nothing handed out. */
static void after_fork_child(void) {
    started = 0;
    atomic_store(&busy, 0);
    atomic_store(&sleepers, 0);
    atomic_store(&ticket, (uint64_t)CLOSED);
    atomic_flag_clear(&owner);
    pthread_mutex_init(&lock, NULL);
    pthread_cond_init(&wake, NULL);
}

static int start_helpers(int wanted) {
    if (!fork_hook) {
        fork_hook = 1;
        pthread_atfork(NULL, NULL, after_fork_child);
    }
    while (started < wanted) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int failed = pthread_create(&t, &attr, helper, (void *)(intptr_t)started);
        pthread_attr_destroy(&attr);
        if (failed) break;
        started++;
    }
    return started;
}

void gemv_i8(const float *x, const int8_t *q, const float *scale, float *out, int64_t rows, int64_t cols,
             float alpha, int accumulate, int threads) {
    Job j = {x, q, scale, out, rows, cols, 0, 0, alpha, accumulate, narrow_simd(), 0};
    int helpers = threads - 1 < MAX_HELPERS ? threads - 1 : MAX_HELPERS;
    if (helpers < 1 || rows < 2 || rows * cols < SHARED_MIN_WEIGHTS ||
        atomic_fetch_add_explicit(&calls, 1, memory_order_relaxed) < atomic_load_explicit(&alone_until,
                                                                                         memory_order_relaxed) ||
        atomic_flag_test_and_set(&owner)) {
        run_rows(&j, 0, rows);
        return;
    }
    j.helpers = start_helpers(helpers);
    j.chunk = CHUNK_WEIGHTS / (cols > 0 ? cols : 1);
    j.chunk = j.chunk < 1 ? 1 : j.chunk;
    j.chunks = (rows + j.chunk - 1) / j.chunk;
    job = j;
    uint32_t gen = (uint32_t)(atomic_load(&ticket) >> 32) + 1;
    atomic_store(&ticket, (uint64_t)gen << 32);  /* open: after the job's fields (sequentially consistent) */
    if (atomic_load(&sleepers)) {
        pthread_mutex_lock(&lock);
        pthread_cond_broadcast(&wake);
        pthread_mutex_unlock(&lock);
    }
    int64_t c, mine = 0;
    while (claim(gen, j.chunks, &c)) {
        run_chunk(&j, c);
        mine++;
    }
    atomic_store(&ticket, ((uint64_t)gen << 32) | CLOSED);
    int64_t waiting = 0;
    for (unsigned spins = 1; atomic_load(&busy); spins++) {  /* only a helper holding a chunk keeps us here */
        pause_once();
        if ((spins & 1023) == 0) {
            waiting = waiting ? waiting : now_ns();
            sched_yield();  /* the helper may need this core to finish its chunk */
        }
    }
    if (waiting)
        atomic_store_explicit(&alone_until, atomic_load(&calls) + (now_ns() - waiting) / NS_PER_ALONE_CALL + 1,
                              memory_order_relaxed);
    window_chunks += j.chunks;
    window_helped += j.chunks - mine;
    if (++window_products == WINDOW) {
        if (window_helped * 10 < window_chunks)
            atomic_store_explicit(&alone_until, atomic_load(&calls) + ALONE_CALLS, memory_order_relaxed);
        window_products = window_chunks = window_helped = 0;
    }
    atomic_flag_clear(&owner);
}
