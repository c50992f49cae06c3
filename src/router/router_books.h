/* router_books.h - the books of a worker that does not report its KV
 * memory (kind = llama-server): a request's KV counted from the model
 * file's own metadata (gguf/gguf_cache.h), whatever its architecture. */
#ifndef SPILLWAY_ROUTER_BOOKS_H
#define SPILLWAY_ROUTER_BOOKS_H

#include "gguf/gguf_cache.h"
#include "router/router_pool.h"

#include <stdint.h>

/* llama-server's batch (n_ubatch): its sliding layers hold the windows of
 * its sequences plus one batch. */
#define RT_BOOKS_LS_UBATCH 512

/* With the pool's lock held, after its /health (rt_pool_reconcile_locked):
 * the books' units and budget of llama-server worker w from the model's
 * cache shape and its /slots figures (slot_ctx: a slot's context, slots:
 * how many). The budget is planned_kv when the router started the server
 * (its command's cache, rt_books_llama_server_plan), else a cache of
 * slot_ctx cells of f16 shared by the slots (llama-server's unified
 * default), its sliding layers holding each slot's window plus a batch.
 * A shape that cannot be counted (recurrent or hybrid state, an encoder,
 * unread metadata) or no slot figures leave memory uncounted: admission
 * then goes by its slots. */
void rt_books_llama_server_locked(rt_worker *w, const eng_gguf_cache_shape *shape,
                                  bool shape_read, int32_t slot_ctx, int32_t slots,
                                  int64_t planned_kv);

/* The KV bytes llama-server's cache of n_ctx cells takes for the shape,
 * as rt_books_llama_server_locked budgets it (0 when not countable). */
int64_t rt_books_budget_bytes(const eng_gguf_cache_shape *shape, int32_t n_ctx, int32_t slots);

/* The memory a llama-server started with argv (argc words) takes for the
 * shape, planned before it starts: its KV cache from -c/--ctx-size (0 or
 * absent: the trained context) and -np/--parallel (absent or -1: its
 * automatic 4 slots), one unified cache of f16 (llama-server's defaults;
 * -ctk/-ctv other than f16 are read too). Writes one line for the log
 * into line (weights_bytes: the file's tensors, added to it); returns the
 * KV bytes, 0 when the shape is not counted per token. Compute buffers
 * are not planned. */
int64_t rt_books_llama_server_plan(const eng_gguf_cache_shape *shape, uint64_t weights_bytes,
                                   const char *const *argv, int argc, char *line, size_t cap);

#endif
