/* cli_model_plan_books.c - `spillway model plan` on a file the engine does
 * not run: the memory figures a llama-server worker of it takes, from the
 * file's metadata alone (gguf/gguf_cache.h), the same figures the router's
 * books count for such a worker. The engine's refusal is said first; what
 * cannot be counted (recurrent or hybrid state, an encoder) is said too,
 * with what is known (a hybrid's attention layers). llama.cpp's compute
 * buffers are not predicted here: they depend on its graph, not on the
 * metadata.
 */
#include "cli/cli.h"

#include "common/alloc.h"
#include "common/units.h"
#include "engine/plan.h"
#include "gguf/gguf.h"
#include "gguf/gguf_cache.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

/* llama.cpp's defaults the figures assume: cells padded to 256, batches
 * of 512 tokens. */
#define BOOKS_CELL_PADDING 256
#define BOOKS_UBATCH 512

uint64_t cli_model_plan_server_kv(const char *path, const eng_plan_params *pp)
{
    eng_gguf *g = NULL;
    eng_gguf_cache_shape s;
    uint64_t bytes = 0;
    if (!eng_gguf_open(path, &g, NULL) && !eng_gguf_cache_shape_read(g, &s, NULL))
        bytes = eng_gguf_cache_server_bytes(&s, pp->kv_type, (int64_t)pp->n_ctx * pp->n_seqs,
                                            pp->n_seqs, BOOKS_UBATCH, BOOKS_CELL_PADDING);
    eng_gguf_close(g);
    return bytes;
}

int cli_model_plan_books(const char *path, const eng_plan_params *pp, bool json,
                         const char *engine_refusal)
{
    eng_gguf *g = NULL;
    eng_gguf_cache_shape s;
    sw_error err;
    if (eng_gguf_open(path, &g, &err) || eng_gguf_cache_shape_read(g, &s, &err)) {
        fprintf(stderr, "spillway model plan: %s\n", err.message);
        eng_gguf_close(g);
        return 1;
    }
    uint64_t weights = 0;
    for (int64_t i = 0; i < eng_gguf_n_tensors(g); i++)
        weights += eng_gguf_tensor_at(g, i)->size_bytes;
    eng_gguf_close(g);

    bool countable = eng_gguf_cache_countable(&s);
    uint64_t global = eng_gguf_cache_bytes_per_token(&s, pp->kv_type, false);
    uint64_t sliding = eng_gguf_cache_bytes_per_token(&s, pp->kv_type, true);
    /* llama-server -c ctx*seqs -np seqs with a unified cache */
    int64_t cells = (int64_t)pp->n_ctx * pp->n_seqs;
    uint64_t server_kv = eng_gguf_cache_server_bytes(&s, pp->kv_type, cells, pp->n_seqs,
                                                     BOOKS_UBATCH, BOOKS_CELL_PADDING);
    const char *kv_type = eng_kv_type_name(pp->kv_type);
    if (json) {
        json_t *rec = json_pack(
            "{s:s, s:s, s:b, s:s, s:s, s:b, s:i, s:i, s:i, s:i, s:I, s:I, s:I, s:I, s:i, s:i, "
            "s:s}",
            "model", path, "architecture", s.architecture, "engine_runs", 0, "engine_refusal",
            engine_refusal, "cache_kind", eng_gguf_cache_kind_name(s.kind), "kv_counted",
            countable, "layers", s.n_layer, "kv_layers", s.n_layer_kv, "sliding_layers",
            s.n_layer_sliding, "sliding_window", s.sliding_window, "weights_bytes",
            (json_int_t)weights, "kv_bytes_per_token", (json_int_t)(global + sliding),
            "kv_sliding_bytes_per_token", (json_int_t)sliding, "llama_server_kv_bytes",
            (json_int_t)server_kv, "ctx", pp->n_ctx, "seqs", pp->n_seqs, "kv_type", kv_type);
        if (!rec) {
            fprintf(stderr, "spillway model plan: out of memory\n");
            return 1;
        }
        if (!countable)
            json_object_set_new(rec, "not_counted", json_string(s.reason));
        /* a recurrent or hybrid family's state: per sequence, one per slot */
        json_object_set_new(rec, "recurrent_layers", json_integer(s.n_layer_recurrent));
        json_object_set_new(rec, "recurrent_state_bytes_per_seq",
                            json_integer((json_int_t)s.recurrent_bytes_per_seq));
        json_object_set_new(rec, "llama_server_state_bytes",
                            json_integer((json_int_t)(s.recurrent_bytes_per_seq *
                                                      (uint64_t)pp->n_seqs)));
        char *text = json_dumps(rec, JSON_COMPACT);
        printf("%s\n", text ? text : "{}");
        sw_free(text);
        json_decref(rec);
        return 0;
    }
    char a[32];
    printf("model %s: architecture %s, %d layers (%d keep KV, %d of them sliding)\n", path,
           s.architecture, s.n_layer, s.n_layer_kv, s.n_layer_sliding);
    printf("engine: cannot run this file (%s); the figures below are a llama-server "
           "worker's, from the file's metadata\n", engine_refusal);
    sw_format_bytes(weights, a, sizeof a);
    printf("  weights        %12s (the file's tensors)\n", a);
    char st[32], st_all[32];
    sw_format_bytes(s.recurrent_bytes_per_seq, st, sizeof st);
    sw_format_bytes(s.recurrent_bytes_per_seq * (uint64_t)pp->n_seqs, st_all, sizeof st_all);
    if (s.kind == ENG_GGUF_CACHE_RECURRENT || s.kind == ENG_GGUF_CACHE_ENCODER) {
        printf("  kv             cannot be counted: %s\n", s.reason);
        if (s.recurrent_bytes_per_seq)
            printf("  recurrent      %12s per sequence in %d layers (f32), %s for -np %d\n", st,
                   s.n_layer_recurrent, st_all, pp->n_seqs);
        printf("admission: by the server's slots only\n");
        return 0;
    }
    printf("  kv per token   %12llu bytes (%s)%s\n", (unsigned long long)(global + sliding),
           kv_type, countable ? "" : ", attention layers only");
    if (sliding)
        printf("  sliding layers %12llu of those bytes per token, held for the window of %d "
               "only\n", (unsigned long long)sliding, s.sliding_window);
    sw_format_bytes(server_kv, a, sizeof a);
    printf("  kv for ctx     %12s: llama-server -c %lld -np %d (one unified cache%s)\n", a,
           (long long)cells, pp->n_seqs,
           sliding ? "; sliding layers: each sequence's window plus a batch of 512" : "");
    if (s.recurrent_bytes_per_seq) {
        char total[32];
        sw_format_bytes(server_kv + s.recurrent_bytes_per_seq * (uint64_t)pp->n_seqs, total, sizeof total);
        printf("  recurrent      %12s per sequence in %d layers (f32), %s for -np %d; with the "
               "kv: %s\n", st, s.n_layer_recurrent, st_all, pp->n_seqs, total);
    }
    if (!countable) {
        printf("  not counted    %s\n", s.reason);
        printf("admission: by the server's slots only\n");
    } else {
        printf("admission: counted per request from these figures (prompt + max_tokens)\n");
    }
    printf("compute buffers: not predicted (llama.cpp's graph, not the metadata)\n");
    return 0;
}
