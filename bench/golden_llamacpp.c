/* Records greedy "golden" outputs of a GGUF model with the reference
 * engine (llama.cpp), in the format of ../shared/models/NAME.golden.json
 * (../shared/models/README.md), so the engine's tests can check a model
 * made by `spillway model make` against an implementation nobody here
 * wrote, without llama.cpp at test time.
 *
 *   golden_llamacpp MODEL.gguf N_TOKENS ENGINE_NAME PROMPT...
 * writes JSON to stdout:
 *   tokenize[]: each prompt tokenized by llama.cpp (special tokens parsed,
 *     no BOS), as `text` and `tokens`;
 *   greedy[]: per prompt, `prompt_tokens_with_bos` (BOS + the tokens above),
 *     the greedy continuation `tokens` (argmax of the logits, N_TOKENS of
 *     them, end-of-generation not stopping it), its `text` (llama.cpp's
 *     detokenization), `first_step_top5` (ids and natural-log
 *     probabilities, full softmax), and `margins`: at each step the
 *     log-probability gap between the best and the second-best token, so a
 *     test can tell a near-tie (where two engines may rightly differ) from
 *     a real disagreement.
 *
 * Built and run by bench/record-goldens.sh against the llama.cpp that
 * bench/llamacpp-build.sh builds; never part of spillway itself. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"
#include "llamacpp_common.h"

static json_t *id_array(const llama_token *ids, int n)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(a, json_integer(ids[i]));
    return a;
}

/* Rounds to 6 decimals so the file stays readable and stable. */
static json_t *rounded(double v) { return json_real(round(v * 1e6) / 1e6); }

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: %s MODEL.gguf N_TOKENS ENGINE_NAME PROMPT...\n", argv[0]);
        return 2;
    }
    const int n_gen = atoi(argv[2]);
    if (n_gen <= 0 || n_gen > 256) {
        fprintf(stderr, "N_TOKENS must be in 1..256\n");
        return 2;
    }
    struct llama_model *model = load_quietly(argv[1]);
    if (!model)
        return 2;
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    double *lp = malloc(sizeof *lp * (size_t)n_vocab);
    llama_token *ids = malloc(sizeof *ids * 4096);
    if (!lp || !ids)
        return 2;

    const char *base = strrchr(argv[1], '/');
    json_t *root = json_object();
    json_object_set_new(root, "model", json_string(base ? base + 1 : argv[1]));
    json_object_set_new(root, "engine", json_string(argv[3]));
    json_t *tokenize = json_array(), *greedy = json_array();
    json_object_set_new(root, "tokenize", tokenize);
    json_object_set_new(root, "greedy", greedy);

    for (int p = 4; p < argc; p++) {
        const char *text = argv[p];
        /* ids[0] is the BOS; the prompt's own tokens follow. */
        int n = llama_tokenize(vocab, text, (int32_t)strlen(text), ids + 1, 4000, false, true);
        if (n < 0) {
            fprintf(stderr, "prompt %d: tokenization failed\n", p - 3);
            return 2;
        }
        json_t *tk = json_object();
        json_object_set_new(tk, "text", json_string(text));
        json_object_set_new(tk, "tokens", id_array(ids + 1, n));
        json_array_append_new(tokenize, tk);

        ids[0] = llama_vocab_bos(vocab);
        const int n_prompt = n + 1;
        struct llama_context_params cp = llama_context_default_params();
        cp.n_ctx = 512;
        cp.n_batch = 512;
        cp.n_threads = cp.n_threads_batch = 2;
        struct llama_context *ctx = llama_init_from_model(model, cp);
        if (!ctx || llama_decode(ctx, llama_batch_get_one(ids, n_prompt)) != 0) {
            fprintf(stderr, "prompt %d: llama_decode failed\n", p - 3);
            return 2;
        }
        json_t *g = json_object(), *out = json_array(), *margins = json_array(),
               *top5 = json_array();
        char text_out[8192] = "";
        size_t text_len = 0;
        json_object_set_new(g, "prompt", json_string(text));
        json_object_set_new(g, "prompt_tokens_with_bos", id_array(ids, n_prompt));
        for (int s = 0; s < n_gen; s++) {
            log_probs(llama_get_logits_ith(ctx, -1), n_vocab, lp);
            int best = 0, second = -1;
            for (int i = 1; i < n_vocab; i++) {
                if (lp[i] > lp[best]) {
                    second = best;
                    best = i;
                } else if (second < 0 || lp[i] > lp[second]) {
                    second = i;
                }
            }
            if (s == 0) {
                /* the five best, by repeated selection */
                int chosen[5];
                for (int k = 0; k < 5 && k < n_vocab; k++) {
                    int arg = -1;
                    for (int i = 0; i < n_vocab; i++) {
                        int taken = 0;
                        for (int j = 0; j < k; j++)
                            taken |= chosen[j] == i;
                        if (!taken && (arg < 0 || lp[i] > lp[arg]))
                            arg = i;
                    }
                    chosen[k] = arg;
                    json_t *e = json_object();
                    json_object_set_new(e, "id", json_integer(arg));
                    json_object_set_new(e, "logprob", rounded(lp[arg]));
                    json_array_append_new(top5, e);
                }
            }
            json_array_append_new(out, json_integer(best));
            json_array_append_new(margins, rounded(lp[best] - lp[second]));
            char piece[256];
            int len = llama_token_to_piece(vocab, best, piece, sizeof piece, 0, false);
            if (len > 0 && text_len + (size_t)len < sizeof text_out) {
                memcpy(text_out + text_len, piece, (size_t)len);
                text_len += (size_t)len;
                text_out[text_len] = '\0';
            }
            llama_token next = best;
            if (llama_decode(ctx, llama_batch_get_one(&next, 1)) != 0) {
                fprintf(stderr, "prompt %d: llama_decode failed at step %d\n", p - 3, s);
                return 2;
            }
        }
        json_object_set_new(g, "tokens", out);
        /* null when the pieces do not join into valid UTF-8 */
        json_t *joined = json_stringn(text_out, text_len);
        json_object_set_new(g, "text", joined ? joined : json_null());
        json_object_set_new(g, "first_step_top5", top5);
        json_object_set_new(g, "margins", margins);
        json_array_append_new(greedy, g);
        llama_free(ctx);
    }
    json_dumpf(root, stdout, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(8));
    fputc('\n', stdout);
    json_decref(root);
    free(lp);
    free(ids);
    llama_model_free(model);
    return 0;
}
