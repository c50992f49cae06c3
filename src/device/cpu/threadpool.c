/* threadpool.c - see threadpool.h. */
#include "device/cpu/threadpool.h"

#include "common/alloc.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

/* Waiting is done in three stages. A short busy spin bridges the gap
 * between two matrix products of one token. Then the waiter yields the core
 * on every check: when the machine is oversubscribed (other workers, a
 * fuzzer, the test suite), the thread we wait for may be the one waiting
 * for our core, and pure spinning would stall both for a whole time slice.
 * After a few milliseconds without work an idle worker sleeps on the
 * condition variable. */
#define SPIN_ITERATIONS 2000
#define YIELD_ITERATIONS 2000

struct cpu_threadpool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mutex;
    pthread_cond_t wake;
    atomic_uint generation;   /* bumped once per job */
    atomic_int pending;       /* workers still running the current job */
    atomic_bool stopping;
    atomic_int sleepers;
    /* the current job */
    cpu_task_fn fn;
    void *arg;
    int64_t n_items;
    int64_t grain;            /* pieces are multiples of it (the last excepted) */
    struct region *regions;   /* n_threads, owned */
    struct worker_start *starts; /* one per worker thread, owned */
};

/* One thread's share of the current job, in grains: [front, back), packed
 * as front | back << 32 so that the owner (taking from the front) and a
 * thief (taking from the back) agree with one compare-and-swap. On its own
 * cache line: the owner touches it once per piece. */
typedef struct region {
    _Alignas(64) atomic_ullong span;
} region;

typedef struct worker_start {
    cpu_threadpool *pool;
    int index;
} worker_start;

int cpu_core_count(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* Takes up to a share of region r's grains: from the front for its owner
 * (an eighth of what is left), from the back for a thief (half of it).
 * Returns the number taken (0: the region is empty) and their first grain. */
static uint32_t take(region *r, bool owner, uint32_t *first)
{
    unsigned long long span = atomic_load_explicit(&r->span, memory_order_relaxed);
    for (;;) {
        uint32_t front = (uint32_t)span, back = (uint32_t)(span >> 32);
        if (front >= back)
            return 0;
        uint32_t left = back - front, k = owner ? (left + 7) / 8 : (left + 1) / 2;
        unsigned long long next = owner ? (unsigned long long)back << 32 | (front + k)
                                        : (unsigned long long)(back - k) << 32 | front;
        if (atomic_compare_exchange_weak_explicit(&r->span, &span, next, memory_order_relaxed,
                                                  memory_order_relaxed)) {
            *first = owner ? front : back - k;
            return k;
        }
    }
}

/* Each thread starts on its own contiguous part of the range and works
 * through it front to back, so in a matrix product every thread streams
 * one run of consecutive rows (the hardware prefetcher, and the kernels'
 * prefetch of the next rows, keep running across its pieces instead of
 * starting cold on a new chunk every few rows). A thread that runs out
 * takes half of what is left of another's part, from the back, so a thread
 * that started late or ran slower (another process on its core, the
 * caller's serial work) does not leave the others waiting: the threads
 * finish within about a grain of each other. That tail matters in decode,
 * where a product is a few tens of microseconds of memory streaming and
 * one thread alone streams at about half the rate of two. */
static void run_chunks(cpu_threadpool *pool, int index)
{
    const int64_t n = pool->n_items, grain = pool->grain;
    const int nt = pool->n_threads;
    for (int i = 0; i < nt; i++) {
        region *r = &pool->regions[(index + i) % nt];
        uint32_t first, k;
        while ((k = take(r, i == 0, &first)) > 0) {
            int64_t begin = (int64_t)first * grain, end = begin + (int64_t)k * grain;
            pool->fn(pool->arg, begin, end < n ? end : n, index);
        }
    }
}

static void *worker_main(void *p)
{
    worker_start *start = p;
    cpu_threadpool *pool = start->pool;
    int index = start->index;
    /* Generation 0 is "no job yet"; reading the counter here instead would
     * miss a job posted before this thread got to run. */
    unsigned seen = 0;

    for (;;) {
        unsigned now;
        int spins = 0;
        while ((now = atomic_load_explicit(&pool->generation, memory_order_acquire)) == seen &&
               !atomic_load(&pool->stopping)) {
            if (++spins < SPIN_ITERATIONS) {
                CPU_RELAX();
                continue;
            }
            if (spins < SPIN_ITERATIONS + YIELD_ITERATIONS) {
                sched_yield();
                continue;
            }
            pthread_mutex_lock(&pool->mutex);
            atomic_fetch_add(&pool->sleepers, 1);
            while (atomic_load(&pool->generation) == seen && !atomic_load(&pool->stopping))
                pthread_cond_wait(&pool->wake, &pool->mutex);
            atomic_fetch_sub(&pool->sleepers, 1);
            pthread_mutex_unlock(&pool->mutex);
            spins = 0;
        }
        if (atomic_load(&pool->stopping))
            return NULL;
        seen = now;
        run_chunks(pool, index);
        atomic_fetch_sub_explicit(&pool->pending, 1, memory_order_release);
    }
}

cpu_threadpool *cpu_threadpool_create(int n_threads)
{
    cpu_threadpool *pool;
    if (n_threads <= 0)
        n_threads = cpu_core_count();
    pool = sw_calloc(1, sizeof *pool);
    if (!pool)
        return NULL;
    pool->n_threads = n_threads;
    pthread_mutex_init(&pool->mutex, NULL);
    pthread_cond_init(&pool->wake, NULL);
    if (n_threads > 1) {
        pool->threads = sw_calloc((size_t)n_threads, sizeof *pool->threads);
        pool->regions = sw_aligned_alloc(64, (size_t)n_threads * sizeof *pool->regions);
        worker_start *s = sw_calloc((size_t)n_threads, sizeof *s);
        if (!pool->threads || !pool->regions || !s) {
            sw_free(s);
            goto fail;
        }
        pool->starts = s;
        for (int i = 1; i < n_threads; i++) {
            s[i].pool = pool;
            s[i].index = i;
            if (pthread_create(&pool->threads[i], NULL, worker_main, &s[i]) != 0) {
                pool->n_threads = i; /* join the ones that started */
                cpu_threadpool_free(pool);
                return NULL;
            }
        }
    }
    return pool;
fail:
    sw_free(pool->threads);
    sw_free(pool->regions);
    pthread_mutex_destroy(&pool->mutex);
    pthread_cond_destroy(&pool->wake);
    sw_free(pool);
    return NULL;
}

void cpu_threadpool_free(cpu_threadpool *pool)
{
    if (!pool)
        return;
    atomic_store(&pool->stopping, true);
    pthread_mutex_lock(&pool->mutex);
    atomic_fetch_add(&pool->generation, 1);
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mutex);
    for (int i = 1; i < pool->n_threads; i++)
        pthread_join(pool->threads[i], NULL);
    sw_free(pool->threads);
    sw_free(pool->regions);
    sw_free(pool->starts);
    pthread_mutex_destroy(&pool->mutex);
    pthread_cond_destroy(&pool->wake);
    sw_free(pool);
}

int cpu_threadpool_size(const cpu_threadpool *pool) { return pool->n_threads; }

void cpu_threadpool_run(cpu_threadpool *pool, int64_t n_items, int64_t grain,
                        cpu_task_fn fn, void *arg)
{
    if (n_items <= 0)
        return;
    if (grain < 1)
        grain = 1;
    if (pool->n_threads == 1 || n_items <= grain) {
        fn(arg, 0, n_items, 0);
        return;
    }
    /* the regions count grains in 32 bits */
    if ((n_items + grain - 1) / grain > (int64_t)1 << 30)
        grain *= (((n_items + grain - 1) / grain) + ((int64_t)1 << 30) - 1) >> 30;
    pool->fn = fn;
    pool->arg = arg;
    pool->n_items = n_items;
    pool->grain = grain;
    {
        const int64_t n_grains = (n_items + grain - 1) / grain, nt = pool->n_threads;
        for (int64_t i = 0; i < nt; i++) {
            unsigned long long front = (unsigned long long)(n_grains * i / nt);
            unsigned long long back = (unsigned long long)(n_grains * (i + 1) / nt);
            atomic_store_explicit(&pool->regions[i].span, back << 32 | front,
                                  memory_order_relaxed);
        }
    }
    atomic_store(&pool->pending, pool->n_threads - 1);
    atomic_fetch_add_explicit(&pool->generation, 1, memory_order_release);
    if (atomic_load(&pool->sleepers) > 0) {
        pthread_mutex_lock(&pool->mutex);
        pthread_cond_broadcast(&pool->wake);
        pthread_mutex_unlock(&pool->mutex);
    }
    run_chunks(pool, 0);
    for (int spins = 0; atomic_load_explicit(&pool->pending, memory_order_acquire) > 0; spins++) {
        if (spins < SPIN_ITERATIONS)
            CPU_RELAX();
        else
            sched_yield();
    }
}
