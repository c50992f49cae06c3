/* test_threadpool.c - the CPU thread pool's division of a loop: every item
 * is run exactly once (threads take their own part from the front and
 * other parts from the back, so a lost or doubled piece would show here),
 * pieces start on a multiple of the grain, and a slow thread's part is
 * finished by the others. Counts are kept per item with atomics; nothing
 * depends on timing for the result. */
#include "testutil.h"

#include "common/alloc.h"
#include "device/cpu/threadpool.h"

#include <stdatomic.h>
#include <string.h>
#include <time.h>

typedef struct count_job {
    atomic_int *hits;     /* per item */
    int64_t n_items, grain;
    atomic_int bad_piece; /* a piece not starting on the grain, or out of range */
    atomic_int calls_by[8];
    bool slow_first;      /* thread 0 sleeps on its first piece */
    atomic_int slept;
} count_job;

static void count_task(void *arg, int64_t begin, int64_t end, int thread_index)
{
    count_job *job = arg;
    if (begin < 0 || end > job->n_items || begin >= end || begin % job->grain != 0 ||
        (end != job->n_items && end % job->grain != 0) || thread_index < 0 || thread_index >= 8)
        atomic_store(&job->bad_piece, 1);
    else
        atomic_fetch_add(&job->calls_by[thread_index], 1);
    if (job->slow_first && thread_index == 0 && atomic_exchange(&job->slept, 1) == 0) {
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    for (int64_t i = begin; i < end && i < job->n_items && i >= 0; i++)
        atomic_fetch_add_explicit(&job->hits[i], 1, memory_order_relaxed);
}

static void run_and_check(cpu_threadpool *pool, int64_t n, int64_t grain, bool slow_first)
{
    count_job job;
    memset(&job, 0, sizeof job);
    job.hits = sw_calloc((size_t)(n ? n : 1), sizeof *job.hits);
    assert_non_null(job.hits);
    job.n_items = n;
    job.grain = grain < 1 ? 1 : grain;
    job.slow_first = slow_first;
    cpu_threadpool_run(pool, n, grain, count_task, &job);
    assert_int_equal(atomic_load(&job.bad_piece), 0);
    for (int64_t i = 0; i < n; i++)
        if (atomic_load(&job.hits[i]) != 1)
            fail_msg("n %lld grain %lld: item %lld ran %d times", (long long)n, (long long)grain,
                     (long long)i, atomic_load(&job.hits[i]));
    sw_free(job.hits);
}

static void test_every_item_once(void **state)
{
    (void)state;
    for (int threads = 1; threads <= 4; threads++) {
        cpu_threadpool *pool = cpu_threadpool_create(threads);
        assert_non_null(pool);
        assert_int_equal(cpu_threadpool_size(pool), threads);
        const int64_t sizes[] = {0, 1, 2, 3, 15, 16, 17, 31, 100, 257, 1000, 4099, 65537};
        const int64_t grains[] = {1, 2, 16, 64};
        for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
            for (size_t g = 0; g < sizeof grains / sizeof *grains; g++)
                run_and_check(pool, sizes[s], grains[g], false);
        /* many loops in a row: the parts are reset between loops */
        for (int rep = 0; rep < 200; rep++)
            run_and_check(pool, 1000 + rep, 16, false);
        cpu_threadpool_free(pool);
    }
}

/* The calling thread (index 0) stalls on its first piece: the others take
 * the rest of its part, and still every item runs once. */
static void test_slow_thread_part_taken(void **state)
{
    (void)state;
    cpu_threadpool *pool = cpu_threadpool_create(3);
    assert_non_null(pool);
    count_job job;
    const int64_t n = 4096;
    memset(&job, 0, sizeof job);
    job.hits = sw_calloc((size_t)n, sizeof *job.hits);
    assert_non_null(job.hits);
    job.n_items = n;
    job.grain = 1;
    job.slow_first = true;
    cpu_threadpool_run(pool, n, 1, count_task, &job);
    assert_int_equal(atomic_load(&job.bad_piece), 0);
    for (int64_t i = 0; i < n; i++)
        assert_int_equal(atomic_load(&job.hits[i]), 1);
    /* the other threads ran pieces too (their own parts at least) */
    assert_true(atomic_load(&job.calls_by[1]) + atomic_load(&job.calls_by[2]) > 0);
    sw_free(job.hits);
    cpu_threadpool_free(pool);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_item_once),
        cmocka_unit_test(test_slow_thread_part_taken),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
