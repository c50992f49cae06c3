/* fault.h - fault injection on every device, from one environment variable.
 *
 *   SPILLWAY_FAULT="mode:value[,mode:value...]"
 *     alloc_fail_after:N   device allocations after the first N fail
 *                          (SW_EDEVOOM, as if the device were full)
 *     alloc_fail_over:B    any single device allocation larger than B bytes
 *                          fails (sizes as in 512MiB)
 *     abort_after_tokens:N the process aborts (SIGABRT) when it is about to
 *                          produce token N+1 of a generation: a crash
 *                          mid-stream after N tokens were emitted (the
 *                          worker's embeddings count each input as one)
 *     stall_ms:N           each generated token is delayed by N ms (a slow
 *                          or hung accelerator)
 *     device_error_after_tokens:N
 *                          the device fails for good (SW_EDEVICE, like a
 *                          sticky CUDA error) when token N+1 is due: a
 *                          worker reports it and exits to be restarted
 *     fault_header:1       the test-only request header X-Spillway-Fault
 *                          is honoured: it fails the Nth host allocation
 *                          of that one request (common/alloc.h, fault
 *                          scopes; the router reads this switch too)
 *
 * Tests and the drill use it to cause each failure on purpose. It is read
 * once per process; dev_fault_set lets a test install a configuration.
 */
#ifndef SPILLWAY_DEVICE_FAULT_H
#define SPILLWAY_DEVICE_FAULT_H

#include "common/error.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct dev_fault_config {
    int64_t alloc_fail_after;   /* -1: off */
    uint64_t alloc_fail_over;   /* 0: off */
    int64_t abort_after_tokens; /* -1: off */
    int64_t stall_ms;           /* 0: off */
    int64_t device_error_after_tokens; /* -1: off */
    int64_t fault_header;       /* 0: off; 1: X-Spillway-Fault honoured */
} dev_fault_config;

#define DEV_FAULT_ENV "SPILLWAY_FAULT"

/* Parses the SPILLWAY_FAULT syntax; SW_EINVAL with a message naming the bad
 * part. An empty or NULL text is "no faults". */
int dev_fault_parse(const char *text, dev_fault_config *out, sw_error *err);

/* The process's configuration (from the environment at first use; an
 * unparsable value is logged and ignored). */
const dev_fault_config *dev_fault_get(void);
/* Replaces it (tests) and resets the counters; NULL means no faults. Not
 * meant to race with allocations on other threads. */
void dev_fault_set(const dev_fault_config *config);

/* Suspends (true) or resumes (false) fault injection on the calling thread
 * only: while suspended, its device allocations neither count toward
 * alloc_fail_after nor fail, and dev_fault_before_token does nothing. For
 * work a process does for itself (the worker's start-up calibration), so
 * the counts that tests and the drill probe are those of real traffic. */
void dev_fault_suspend(bool suspended);

/* Called by every device allocation (device.c, before the backend): true if
 * this one must fail. Each call counts, from every thread, once (none while
 * the calling thread has the faults suspended). */
bool dev_fault_alloc_should_fail(size_t bytes);

/* Called before each generated token with the number already produced in
 * this generation: aborts the process or stalls as configured, and returns
 * SW_EDEVICE when an unrecoverable device error is injected (else SW_OK). */
int dev_fault_before_token(int64_t tokens_emitted);

#endif
