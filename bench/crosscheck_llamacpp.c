/* Compares spillway's next-token log-probabilities with the reference
 * engine's (llama.cpp) on the same GGUF file: a second, independent
 * implementation of every architecture and weight type we load, for the
 * shapes ../shared has no recorded outputs of (qwen2, Llama 3 RoPE
 * scaling, K-quants, BF16).
 *
 * Input: the JSON that `spillway run --json --temp 0 --top-logprobs K`
 * printed. The prompt's token ids are fed to llama.cpp as they are (no
 * second tokenizer in the comparison); then, step by step, spillway's
 * chosen token is fed back (teacher forcing), so one differing argmax does
 * not derail the rest. At each step: does llama.cpp's argmax equal
 * spillway's token, and how far apart are the two log-probabilities of
 * each of spillway's top-K ids.
 *
 *   crosscheck_llamacpp MODEL.gguf RUN.json [EXACT.gguf]
 * prints "STEPS AGREE MAXDIFF MEANDIFF": the number of steps, in how many
 * of them llama.cpp's argmax is spillway's token, and the largest and the
 * mean |difference| between the two engines' log-probabilities of
 * spillway's top-K ids. With EXACT.gguf (the same weights dequantized),
 * llama.cpp runs that file on the same tokens too, and a fifth figure is
 * the mean |difference| between its two runs - llama.cpp's distance from
 * exact arithmetic on spillway's token sequence, the one spillway's own
 * distance is measured on.
 * bench/crosscheck.sh judges the figures; exit status 2 is an error.
 * CROSSCHECK_STEPS=1 in the environment also prints each step's mean
 * |difference| to stderr (and with EXACT.gguf the step's fifth figure).
 *
 * Built by bench/crosscheck.sh against the llama.cpp that
 * bench/reference.sh builds; never part of spillway itself. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "llama.h"
#include "llamacpp_common.h"

int main(int argc, char **argv)
{
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: %s MODEL.gguf RUN.json [EXACT.gguf]\n", argv[0]);
        return 2;
    }
    json_error_t jerr;
    json_t *run = json_load_file(argv[2], 0, &jerr);
    json_t *prompt = json_object_get(run, "prompt_tokens");
    json_t *steps = json_object_get(run, "top_logprobs");
    if (!json_is_array(prompt) || !json_is_array(steps) || json_array_size(prompt) == 0) {
        fprintf(stderr, "%s: not the JSON of `spillway run --json --top-logprobs K`\n", argv[2]);
        return 2;
    }

    struct llama_model *model = load_quietly(argv[1]);
    struct llama_model *exact = argc == 4 ? load_quietly(argv[3]) : NULL;
    if (!model || (argc == 4 && !exact))
        return 2;
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 512;
    cp.n_batch = 512;
    cp.n_threads = cp.n_threads_batch = 2;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    struct llama_context *ctx_exact = exact ? llama_init_from_model(exact, cp) : NULL;
    int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    double *lp = malloc(sizeof *lp * (size_t)n_vocab);
    double *lp_exact = malloc(sizeof *lp_exact * (size_t)n_vocab);
    if ((exact && !ctx_exact) || !lp_exact)
        return 2;
    size_t n_prompt = json_array_size(prompt);
    llama_token *tokens = malloc(sizeof *tokens * n_prompt);
    if (!ctx || !lp || !tokens)
        return 2;
    for (size_t i = 0; i < n_prompt; i++)
        tokens[i] = (llama_token)json_integer_value(json_array_get(prompt, i));
    if (llama_decode(ctx, llama_batch_get_one(tokens, (int32_t)n_prompt)) != 0 ||
        (ctx_exact && llama_decode(ctx_exact, llama_batch_get_one(tokens, (int32_t)n_prompt)))) {
        fprintf(stderr, "llama_decode failed on the prompt\n");
        return 2;
    }

    size_t n_steps = json_array_size(steps), agree = 0;
    double worst = 0, sum = 0, sum_exact = 0;
    size_t compared = 0;
    for (size_t s = 0; s < n_steps; s++) {
        json_t *step = json_array_get(steps, s);
        llama_token ours = (llama_token)json_integer_value(json_object_get(step, "token"));
        log_probs(llama_get_logits_ith(ctx, -1), n_vocab, lp);
        if (ctx_exact)
            log_probs(llama_get_logits_ith(ctx_exact, -1), n_vocab, lp_exact);
        int argmax = 0;
        for (int i = 1; i < n_vocab; i++)
            if (lp[i] > lp[argmax])
                argmax = i;
        agree += argmax == ours;
        json_t *top = json_object_get(step, "top_logprobs");
        double step_sum = 0, step_exact = 0;
        for (size_t k = 0; k < json_array_size(top); k++) {
            json_t *e = json_array_get(top, k);
            json_int_t id = json_integer_value(json_object_get(e, "id"));
            if (id < 0 || id >= n_vocab)
                return 2;
            double d = fabs(json_real_value(json_object_get(e, "logprob")) - lp[id]);
            if (d > worst)
                worst = d;
            sum += d;
            step_sum += d;
            if (ctx_exact) {
                sum_exact += fabs(lp[id] - lp_exact[id]);
                step_exact += fabs(lp[id] - lp_exact[id]);
            }
            compared++;
        }
        if (getenv("CROSSCHECK_STEPS")) { /* where a mean comes from, step by step */
            double k = (double)(json_array_size(top) ?: 1);
            fprintf(stderr, "step %zu: argmax %s, mean |difference| %.6f", s,
                    argmax == ours ? "=" : "!=", step_sum / k);
            if (ctx_exact)
                fprintf(stderr, ", exact %.6f", step_exact / k);
            fprintf(stderr, "\n");
        }
        if (llama_decode(ctx, llama_batch_get_one(&ours, 1)) != 0 ||
            (ctx_exact && llama_decode(ctx_exact, llama_batch_get_one(&ours, 1)) != 0)) {
            fprintf(stderr, "llama_decode failed at step %zu\n", s);
            return 2;
        }
    }
    printf("%zu %zu %.6f %.6f", n_steps, agree, worst, compared ? sum / (double)compared : 0.0);
    if (ctx_exact)
        printf(" %.6f", compared ? sum_exact / (double)compared : 0.0);
    printf("\n");
    free(lp);
    free(lp_exact);
    llama_free(ctx_exact);
    llama_model_free(exact);
    free(tokens);
    llama_free(ctx);
    llama_model_free(model);
    json_decref(run);
    return 0;
}
