/* generate.c - see generate.h. */
#include "engine/generate.h"

#include "grammar/constrain.h"

#include "common/alloc.h"
#include "device/fault.h"

#include <math.h>
#include <string.h>
#include <time.h>

double eng_now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

eng_generate_params eng_generate_default_params(void)
{
    eng_generate_params p;
    memset(&p, 0, sizeof p);
    p.max_tokens = 64;
    p.sampling = eng_sampler_default_params();
    return p;
}

const char *eng_finish_reason_name(eng_finish_reason reason)
{
    switch (reason) {
    case ENG_FINISH_STOP: return "stop";
    case ENG_FINISH_CANCELLED: return "cancelled";
    case ENG_FINISH_LENGTH: break;
    }
    return "length";
}

int32_t eng_top_logprobs(const float *logprobs, int32_t n_vocab, int32_t k,
                         eng_token_logprob *top)
{
    int32_t n = 0;
    for (int32_t id = 0; id < n_vocab && k > 0; id++) {
        float lp = logprobs[id];
        if (n == k && !(lp > top[n - 1].logprob))
            continue;
        int32_t at = n < k ? n++ : k - 1;
        while (at > 0 && lp > top[at - 1].logprob) {
            top[at] = top[at - 1];
            at--;
        }
        top[at].id = id;
        top[at].logprob = lp;
    }
    return n;
}

int eng_constraint_sample(eng_constraint *c, eng_sampler *s, float *logits, int32_t n_logits,
                          const int32_t *history, size_t n_history, int64_t remaining_tokens,
                          int32_t *token_out, bool *is_end, sw_error *err)
{
    uint32_t *mask = eng_constraint_mask_buffer(c);
    int32_t n_tokens = eng_constraint_n_tokens(c);
    int32_t allowed = eng_constraint_mask(c, remaining_tokens, mask);
    if (allowed == 0)
        return sw_error_set(err, SW_EINVAL,
                            "no token can continue the constrained output within the budget");
    eng_sampler_mask_logits(logits, n_logits, mask, n_tokens);
    int32_t tok = eng_sampler_sample(s, logits, history, n_history);
    if (tok < 0 || tok >= n_tokens || !(mask[tok >> 5] >> (tok & 31) & 1u)) {
        /* Only possible with non-finite logits everywhere: the first
         * allowed token keeps the output valid. */
        for (tok = 0; tok < n_tokens; tok++)
            if (mask[tok >> 5] >> (tok & 31) & 1u)
                break;
    }
    bool end = eng_constraint_is_end_token(c, tok);
    if (!eng_constraint_accept_token(c, tok))
        return sw_error_set(err, SW_EINTERNAL, "an allowed token was refused by the automaton");
    *token_out = tok;
    if (is_end)
        *is_end = end;
    return SW_OK;
}

int eng_sample_step(const eng_step_inputs *in, float *logits, int32_t *history,
                    size_t *n_history, eng_generate_step *step, bool *constraint_end,
                    sw_error *err)
{
    if (in->logprobs) {
        eng_log_softmax(logits, in->logprobs, in->n_vocab);
        step->n_top = eng_top_logprobs(in->logprobs, in->n_vocab, in->top_logprobs, step->top);
    }
    bool end = false;
    if (in->constraint) {
        int rc = eng_constraint_sample(in->constraint, in->sampler, logits, in->n_vocab, history,
                                       *n_history, in->budget, &step->token, &end, err);
        if (rc)
            return rc;
        end = end || eng_constraint_is_closed(in->constraint);
    } else {
        step->token = eng_sampler_sample(in->sampler, logits, history, *n_history);
    }
    if (in->logprobs)
        step->logprob = in->logprobs[step->token];
    history[(*n_history)++] = step->token;
    *constraint_end = end;
    return SW_OK;
}

int eng_generate(eng_context *ctx, const int32_t *prompt, int32_t n_prompt,
                 const eng_generate_params *params, eng_generate_on_token on_token,
                 void *user, eng_generate_stats *stats, sw_error *err)
{
    const eng_model *model = eng_context_model(ctx);
    const eng_hparams *hp = eng_model_hparams(model);
    const eng_tokenizer *tok = eng_model_tokenizer(model);
    const int32_t n_vocab = hp->n_vocab;
    int32_t n_ctx = eng_context_params_get(ctx)->n_ctx;
    int32_t top_k = params->top_logprobs;
    float *logits = NULL, *logprobs = NULL;
    int32_t *history = NULL;
    eng_sampler *sampler = NULL;
    size_t n_history = 0;
    int rc = SW_OK;
    double t0;

    memset(stats, 0, sizeof *stats);
    if (n_prompt <= 0)
        return sw_error_set(err, SW_EINVAL, "the prompt is empty");
    if (params->max_tokens < 0 || top_k < 0 || top_k > ENG_MAX_TOP_LOGPROBS ||
        params->replay_tokens < 0 || params->replay_tokens >= n_prompt)
        return sw_error_set(err, SW_EINVAL,
                            "max_tokens, top_logprobs or replay_tokens out of range");
    if (n_prompt > n_ctx || (n_prompt == n_ctx && params->max_tokens > 0 &&
                             params->replay_tokens == 0))
        return sw_error_set(err, SW_ECONTEXT,
                            "the prompt has %d tokens; the context holds %d, prompt and "
                            "generated tokens together",
                            n_prompt, n_ctx);
    if (params->constraint) {
        /* the constraint closes the value within the budget, if it can */
        int64_t budget = params->max_tokens < n_ctx - n_prompt ? params->max_tokens
                                                                : n_ctx - n_prompt;
        if (eng_constraint_min_bytes(params->constraint) > budget)
            return sw_error_set(err, SW_EINVAL,
                                "the response format needs at least %lld more tokens, the "
                                "budget is %lld",
                                (long long)eng_constraint_min_bytes(params->constraint),
                                (long long)budget);
    }

    logits = sw_malloc((size_t)n_vocab * sizeof(float));
    logprobs = top_k ? sw_malloc((size_t)n_vocab * sizeof(float)) : NULL;
    history = sw_malloc(((size_t)n_prompt + (size_t)params->max_tokens) * sizeof(int32_t));
    sampler = eng_sampler_create(&params->sampling, n_vocab);
    if (!logits || (top_k && !logprobs) || !history || !sampler) {
        rc = sw_error_set(err, SW_ENOMEM, "out of memory starting a generation");
        goto done;
    }
    eng_sampler_set_draws(sampler, params->skip_draws);
    memcpy(history, prompt, (size_t)n_prompt * sizeof(int32_t));
    n_history = (size_t)n_prompt;

    eng_seq_clear(ctx, params->seq_id);
    if (eng_context_params_get(ctx)->kv_policy == ENG_KV_RESERVE) {
        /* Admission: the whole need now, or nothing and no work done. */
        int64_t need = (int64_t)n_prompt + params->max_tokens;
        if ((rc = eng_seq_reserve(ctx, params->seq_id, need < n_ctx ? (int32_t)need : n_ctx, err)))
            goto done;
    }
    stats->n_prompt = n_prompt;
    stats->finish = ENG_FINISH_LENGTH;
    t0 = eng_now_seconds();
    {
        int32_t n_fresh = n_prompt - params->replay_tokens;
        if ((rc = eng_decode(ctx, params->seq_id, prompt, n_fresh, logits, err)))
            goto done;
        for (int32_t i = n_fresh; i < n_prompt; i++)
            if ((rc = eng_decode(ctx, params->seq_id, &prompt[i], 1, logits, err)))
                goto done;
    }
    stats->prefill_seconds = eng_now_seconds() - t0;
    t0 = eng_now_seconds();

    /* prompt + generated tokens fill at most the context */
    const int32_t max_gen = params->max_tokens < n_ctx - n_prompt ? params->max_tokens
                                                                  : n_ctx - n_prompt;
    for (int32_t i = 0; i < max_gen; i++) {
        eng_generate_step step;
        if ((rc = dev_fault_before_token((int64_t)i))) {
            sw_error_set(err, rc, "the device failed (injected by SPILLWAY_FAULT)");
            goto done;
        }
        memset(&step, 0, sizeof step);
        step.index = i;
        int64_t left_ctx = (int64_t)n_ctx - eng_seq_length(ctx, params->seq_id);
        eng_step_inputs in = {
            .sampler = sampler,
            .n_vocab = n_vocab,
            .logprobs = top_k ? logprobs : NULL,
            .top_logprobs = top_k,
            .constraint = params->constraint,
            .budget = params->max_tokens - i < left_ctx ? params->max_tokens - i : left_ctx,
        };
        bool eog;
        if ((rc = eng_sample_step(&in, logits, history, &n_history, &step, &eog, err)))
            goto done;
        if (!params->constraint)
            eog = !params->ignore_eos && eng_tokenizer_is_eog(tok, step.token);
        stats->n_generated++;
        if (on_token && !on_token(user, &step)) {
            stats->finish = ENG_FINISH_CANCELLED;
            break;
        }
        if (eog) {
            stats->finish = ENG_FINISH_STOP;
            break;
        }
        if (i + 1 == max_gen)
            break;
        if ((rc = eng_decode(ctx, params->seq_id, &step.token, 1, logits, err)))
            goto done;
    }
    stats->decode_seconds = eng_now_seconds() - t0;
done:
    eng_seq_clear(ctx, params->seq_id);
    eng_sampler_free(sampler);
    sw_free(history);
    sw_free(logprobs);
    sw_free(logits);
    return rc;
}
