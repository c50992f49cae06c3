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
    int64_t grain;            /* chunks are multiples of it (the last excepted) */
    atomic_llong next;        /* first item not yet taken */
    struct worker_start *starts; /* one per worker thread, owned */
};

typedef struct worker_start {
    cpu_threadpool *pool;
    int index;
} worker_start;

int cpu_core_count(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* Threads take chunks of the range from a shared counter until it runs out,
 * so a thread that started late or ran slower (another process on its core,
 * the caller's serial work) does not leave the others waiting at the end.
 * Chunks shrink as the range runs out (each is 1 / (2 n_threads) of what
 * is left, rounded up to the grain): the first ones are large, so the
 * counter is touched a few dozen times at most, and the last ones are one
 * grain, so the threads finish within a grain of each other. That tail
 * matters in decode, where a product is a few tens of microseconds of
 * memory streaming and one thread alone streams at about half the rate
 * of two: equal chunks of an eighth of the range left up to an eighth
 * of the product to one thread. */
static void run_chunks(cpu_threadpool *pool, int index)
{
    const int64_t n = pool->n_items, grain = pool->grain;
    const int64_t parts = 2 * (int64_t)pool->n_threads;
    int64_t begin = atomic_load_explicit(&pool->next, memory_order_relaxed);
    for (;;) {
        int64_t end;
        do {
            if (begin >= n)
                return;
            int64_t size = (n - begin + parts - 1) / parts;
            size = (size + grain - 1) / grain * grain;
            end = n - begin > size ? begin + size : n;
        } while (!atomic_compare_exchange_weak_explicit(&pool->next, &begin, end,
                                                        memory_order_relaxed,
                                                        memory_order_relaxed));
        pool->fn(pool->arg, begin, end, index);
        begin = atomic_load_explicit(&pool->next, memory_order_relaxed);
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
        worker_start *s = sw_calloc((size_t)n_threads, sizeof *s);
        if (!pool->threads || !s) {
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
    pool->fn = fn;
    pool->arg = arg;
    pool->n_items = n_items;
    pool->grain = grain;
    atomic_store_explicit(&pool->next, 0, memory_order_relaxed);
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
