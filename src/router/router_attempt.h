/* router_attempt.h - one attempt: one exchange with one upstream, its
 * answer relayed to the sink, ending in an outcome.
 */
#ifndef SPILLWAY_ROUTER_ATTEMPT_H
#define SPILLWAY_ROUTER_ATTEMPT_H

#include "router/router_failover.h"
#include "router/router_sink.h"

#include <stdbool.h>
#include <stddef.h>

/* Sends body to worker wi (whose reservation the books hold: the caller
 * gives it back), the process generation the grant saw (pooled
 * connections of an earlier process are not reused), and relays the
 * answer to r's sink. RT_OUT_REFUSED sets *refused_memory when the worker
 * said its memory, not its slots. No lock is taken. */
rt_outcome rt_attempt_run(rt_relay *r, int wi, uint64_t generation, const char *body, size_t len,
                          bool *refused_memory);

#endif
