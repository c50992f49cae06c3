/* threadpool.h - a fixed set of threads that run one parallel loop at a time.
 *
 * The forward pass issues dozens of short parallel loops per token (one per
 * matrix product), so hand-off latency matters more than anything else:
 * workers spin on an atomic generation counter for a short while before
 * sleeping on a condition variable, and the caller takes part in the work
 * instead of waiting idle. Each thread works front to back through its
 * own contiguous part of the range (in a matrix product: one unbroken
 * stream of rows) and then takes half of what is left of another's part,
 * so one thread slowed down (another process on its core, the caller's own
 * serial work) does not leave the other waiting. Which thread computes an
 * item never changes the result: every item's work is independent.
 */
#ifndef SPILLWAY_DEVICE_CPU_THREADPOOL_H
#define SPILLWAY_DEVICE_CPU_THREADPOOL_H

#include <stdint.h>

typedef struct cpu_threadpool cpu_threadpool;

/* fn runs on [begin, end) of the item range; thread_index in [0, n_threads). */
typedef void (*cpu_task_fn)(void *arg, int64_t begin, int64_t end, int thread_index);

/* n_threads includes the calling thread; <= 0 means the number of online
 * cores. Returns NULL if threads cannot be started. */
cpu_threadpool *cpu_threadpool_create(int n_threads);
void cpu_threadpool_free(cpu_threadpool *pool);
int cpu_threadpool_size(const cpu_threadpool *pool);

/* Runs fn over [0, n_items) in pieces of a multiple of `grain` items
 * (except the last) and returns when all are done. Thread i starts at
 * item about i * n_items / n_threads (rounded to the grain).
 * fn may be called several times per thread. Not reentrant: one caller at
 * a time. */
void cpu_threadpool_run(cpu_threadpool *pool, int64_t n_items, int64_t grain,
                        cpu_task_fn fn, void *arg);

/* Number of online CPU cores (at least 1). */
int cpu_core_count(void);

#endif
