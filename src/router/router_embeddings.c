/* router_embeddings.c - POST /v1/embeddings through the router.
 *
 * An embeddings request takes the completions path (router_relay.c,
 * router_attempt.c): routed by "model", admitted, relayed to one worker
 * at a time, its answer passed on as it is, replayed whole on another
 * worker when one fails (it sends nothing before its answer, so it always
 * can be), Idempotency-Key honoured. What differs is said by rt_req's
 * embeddings flag: the path, no stream, no seed, no job, and the count
 * here. The worker runs the inputs one after another, each its own
 * sequence, so the books take the KV of the longest input (and the
 * context must hold it), while the deadline's prediction counts every
 * input's tokens as prefill.
 */
#include "router/router-impl.h"

#include "api/api_embeddings.h"

#include <limits.h>

long rt__embeddings_tokens(const rt_model *m, json_t *body, long *total)
{
    api_embed_inputs in;
    api_error e;
    *total = 0;
    if (!m->tok || !api_embed_inputs_parse(m->tok, body, &in, &e))
        return -1;
    long longest = in.n_tokens_max;
    *total = in.n_tokens > (int64_t)LONG_MAX ? LONG_MAX : (long)in.n_tokens;
    api_embed_inputs_free(&in);
    return longest;
}
