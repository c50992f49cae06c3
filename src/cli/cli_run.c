/* cli_run.c - `spillway run`: one-shot generation on the command line.
 *
 * Streams the generated text to stdout as it is produced (never half a UTF-8
 * character), with timings on stderr; --json prints one machine-readable
 * record instead (tokens, counts, speeds, and with --top-logprobs each step's
 * K most likely tokens with their natural-log probabilities).
 * --json-schema FILE constrains the output to JSON valid under the schema
 * in FILE (grammar/constrain.h), as the worker's response_format does.
 */
#include "cli/cli.h"

#include "common/alloc.h"
#include "common/log.h"
#include "device/device.h"
#include "grammar/constrain.h"
#include "engine/generate.h"
#include "grammar/json_schema.h"
#include "engine/model.h"
#include "text/tokenizer.h"
#include "quant/quant.h"

#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct run_options {
    const char *model_path;
    const char *prompt;
    int32_t n_predict;
    int32_t n_threads;
    int32_t n_ctx;
    int32_t top_logprobs;
    bool json;
    bool ignore_eos;
    bool no_bos;
    const char *device;
    unsigned long long sim_capacity;
    int32_t gpu_layers;
    eng_kv_policy policy;
    uint32_t kv_type;
    float reserve;
    eng_sampler_params sampling;
    const char *json_schema;    /* --json-schema FILE, or NULL */
} run_options;

typedef struct run_state {
    const run_options *opts;
    const eng_tokenizer *tok;
    eng_detok detok;
    json_t *tokens;     /* --json: generated ids */
    json_t *steps;      /* --json with --top-logprobs */
} run_state;

static void usage(FILE *out)
{
    fprintf(out,
            "usage: spillway run -m FILE -p PROMPT [options]\n"
            "  -m, --model FILE        GGUF model\n"
            "  -p, --prompt TEXT       prompt (BOS is added when the vocabulary asks for it)\n"
            "  -n, --n-predict N       tokens to generate (default 64)\n"
            "      --temp T            temperature; 0 = greedy (default 0)\n"
            "      --top-k K           (default 40; 0 = off)\n"
            "      --top-p P           (default 0.95; 1 = off)\n"
            "      --min-p P           (default 0.05; 0 = off)\n"
            "      --repeat-penalty R  (default 1 = off)\n"
            "      --presence-penalty P, --frequency-penalty F  (OpenAI semantics)\n"
            "      --seed S            sampler seed (default 0)\n"
            "  -t, --threads N         threads (default: one per core)\n"
            "  -c, --ctx N             context size (default: min(trained, 4096))\n"
            "      --top-logprobs K    record the K most likely tokens per step (with --json)\n"
            "      --ignore-eos        keep generating past end-of-text\n"
            "      --no-bos            do not prepend BOS\n"
            "      --json              print one JSON record instead of the text\n"
            "      --json-schema FILE  generate JSON valid under the JSON Schema in FILE\n"
            "      --device D          cpu (default: host memory), sim-gpu:NAME, cuda:N\n"
            "      --sim-capacity B    capacity when creating a sim-gpu pool (e.g. 512MiB)\n"
            "      --gpu-layers N      layers on the device: -1 = all (default), N = split\n"
            "      --policy P          reserve (default) | grow: when KV memory is taken\n"
            "      --kv-type T         f16 (default) | q8_0 | q4_0 | f32: the KV cache's elements\n"
            "      --reserve F         share of the device never used (default 0.10)\n");
}

static bool on_token(void *user, const eng_generate_step *step)
{
    run_state *st = user;
    if (st->opts->json) {
        json_array_append_new(st->tokens, json_integer(step->token));
        if (st->steps) {
            json_t *top = json_array();
            for (int32_t i = 0; i < step->n_top; i++)
                json_array_append_new(top, json_pack("{s:i, s:f}", "id", step->top[i].id,
                                                     "logprob", (double)step->top[i].logprob));
            json_array_append_new(st->steps,
                                  json_pack("{s:i, s:f, s:o}", "token", step->token, "logprob",
                                            (double)step->logprob, "top_logprobs", top));
        }
    } else {
        char buf[256];
        size_t n = eng_detok_push(st->tok, &st->detok, step->token, buf, sizeof buf);
        fwrite(buf, 1, n, stdout);
        fflush(stdout);
    }
    return true;
}

static int parse_options(int argc, char **argv, run_options *o)
{
    enum { OPT_TEMP = 256, OPT_TOPK, OPT_TOPP, OPT_MINP, OPT_REPEAT, OPT_PRESENCE,
           OPT_FREQUENCY, OPT_SEED, OPT_TOPLOGPROBS, OPT_JSON, OPT_IGNORE_EOS, OPT_NO_BOS,
           OPT_DEVICE, OPT_SIM_CAPACITY, OPT_GPU_LAYERS, OPT_POLICY, OPT_RESERVE,
           OPT_JSON_SCHEMA, OPT_KV_TYPE };
    static const struct option longopts[] = {
        {"model", required_argument, 0, 'm'},   {"prompt", required_argument, 0, 'p'},
        {"n-predict", required_argument, 0, 'n'}, {"threads", required_argument, 0, 't'},
        {"ctx", required_argument, 0, 'c'},     {"temp", required_argument, 0, OPT_TEMP},
        {"top-k", required_argument, 0, OPT_TOPK}, {"top-p", required_argument, 0, OPT_TOPP},
        {"min-p", required_argument, 0, OPT_MINP},
        {"repeat-penalty", required_argument, 0, OPT_REPEAT},
        {"presence-penalty", required_argument, 0, OPT_PRESENCE},
        {"frequency-penalty", required_argument, 0, OPT_FREQUENCY},
        {"seed", required_argument, 0, OPT_SEED},
        {"top-logprobs", required_argument, 0, OPT_TOPLOGPROBS},
        {"json", no_argument, 0, OPT_JSON},     {"ignore-eos", no_argument, 0, OPT_IGNORE_EOS},
        {"no-bos", no_argument, 0, OPT_NO_BOS}, {"help", no_argument, 0, 'h'},
        {"device", required_argument, 0, OPT_DEVICE},
        {"sim-capacity", required_argument, 0, OPT_SIM_CAPACITY},
        {"gpu-layers", required_argument, 0, OPT_GPU_LAYERS},
        {"policy", required_argument, 0, OPT_POLICY},
        {"reserve", required_argument, 0, OPT_RESERVE},
        {"json-schema", required_argument, 0, OPT_JSON_SCHEMA},
        {"kv-type", required_argument, 0, OPT_KV_TYPE},
        {0, 0, 0, 0},
    };
    int c;
    char *end;

    memset(o, 0, sizeof *o);
    o->kv_type = ENG_TYPE_F16;
    o->n_predict = 64;
    o->sampling = eng_sampler_default_params();
    o->sampling.temperature = 0.0f;
    o->gpu_layers = -1;
    o->reserve = 0.10f;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:p:n:t:c:h", longopts, NULL)) != -1) {
        double value = 0.0;
        if (optarg) {
            value = strtod(optarg, &end);
            bool text = c == 'm' || c == 'p' || c == OPT_DEVICE || c == OPT_POLICY ||
                        c == OPT_SIM_CAPACITY || c == OPT_JSON_SCHEMA || c == OPT_KV_TYPE;
            if (!text && (*end || end == optarg)) {
                fprintf(stderr, "spillway run: '%s' is not a number\n", optarg);
                return 2;
            }
        }
        switch (c) {
        case 'm': o->model_path = optarg; break;
        case 'p': o->prompt = optarg; break;
        case 'n': o->n_predict = (int32_t)value; break;
        case 't': o->n_threads = (int32_t)value; break;
        case 'c': o->n_ctx = (int32_t)value; break;
        case OPT_TEMP: o->sampling.temperature = (float)value; break;
        case OPT_TOPK: o->sampling.top_k = (int32_t)value; break;
        case OPT_TOPP: o->sampling.top_p = (float)value; break;
        case OPT_MINP: o->sampling.min_p = (float)value; break;
        case OPT_REPEAT: o->sampling.repeat_penalty = (float)value; break;
        case OPT_PRESENCE: o->sampling.presence_penalty = (float)value; break;
        case OPT_FREQUENCY: o->sampling.frequency_penalty = (float)value; break;
        case OPT_SEED: o->sampling.seed = strtoull(optarg, NULL, 10); break;
        case OPT_TOPLOGPROBS: o->top_logprobs = (int32_t)value; break;
        case OPT_JSON: o->json = true; break;
        case OPT_JSON_SCHEMA: o->json_schema = optarg; break;
        case OPT_IGNORE_EOS: o->ignore_eos = true; break;
        case OPT_NO_BOS: o->no_bos = true; break;
        case OPT_DEVICE: o->device = optarg; break;
        case OPT_SIM_CAPACITY:
            if (cli_parse_bytes(optarg, &o->sim_capacity)) {
                fprintf(stderr, "spillway run: bad size '%s'\n", optarg);
                return 2;
            }
            break;
        case OPT_GPU_LAYERS: o->gpu_layers = (int32_t)value; break;
        case OPT_POLICY:
            if (strcmp(optarg, "reserve") == 0) {
                o->policy = ENG_KV_RESERVE;
            } else if (strcmp(optarg, "grow") == 0) {
                o->policy = ENG_KV_GROW;
            } else {
                fprintf(stderr, "spillway run: --policy is reserve or grow\n");
                return 2;
            }
            break;
        case OPT_KV_TYPE:
            if (cli_parse_kv_type("run", optarg, &o->kv_type))
                return 2;
            break;
        case OPT_RESERVE: o->reserve = (float)value; break;
        case 'h': usage(stdout); return 1;
        default: usage(stderr); return 2;
        }
    }
    if (!o->model_path || !o->prompt) {
        fprintf(stderr, "spillway run: -m MODEL and -p PROMPT are required\n");
        usage(stderr);
        return 2;
    }
    if (o->n_predict < 0 || o->n_predict > 1000000 || o->n_threads < 0 || o->n_threads > 1024 ||
        o->n_ctx < 0 || o->top_logprobs < 0 || o->top_logprobs > ENG_MAX_TOP_LOGPROBS) {
        fprintf(stderr, "spillway run: an option is out of range (--top-logprobs is at most %d)\n",
                ENG_MAX_TOP_LOGPROBS);
        return 2;
    }
    return 0;
}

/* The grammar of --json-schema FILE. */
static int load_schema(const char *path, eng_grammar **out, sw_error *err)
{
    json_error_t je;
    json_t *schema = json_load_file(path, JSON_DECODE_ANY, &je);
    if (!schema)
        return sw_error_set(err, SW_EINVAL, "--json-schema %s: %s (line %d)", path, je.text,
                            je.line);
    int rc = eng_grammar_from_schema(schema, out, err);
    json_decref(schema);
    return rc;
}

int cli_run_main(int argc, char **argv)
{
    run_options opts;
    run_state st;
    eng_model *model = NULL;
    eng_context *ctx = NULL;
    dev_device *dev = NULL;
    int32_t *prompt = NULL;
    size_t n_prompt = 0;
    eng_generate_stats stats;
    eng_grammar *grammar = NULL;
    eng_cs_vocab *cs_vocab = NULL;
    eng_constraint *constraint = NULL;
    sw_error err;
    int status = 1, rc;

    rc = parse_options(argc, argv, &opts);
    if (rc)
        return rc == 1 ? 0 : rc;
    memset(&st, 0, sizeof st);
    st.opts = &opts;

    sw_error_clear(&err);
    if (opts.json_schema && (rc = load_schema(opts.json_schema, &grammar, &err)))
        goto fail;
    if (opts.device) {
        dev_options dopts = {.sim_capacity_bytes = opts.sim_capacity};
        if ((rc = dev_open(opts.device, &dopts, &dev, &err)))
            goto fail;
    }
    eng_model_load_params lp = eng_model_load_default_params();
    if (dev && dev_get_kind(dev) != DEV_KIND_CPU)
        lp.n_device_layers = opts.gpu_layers; /* uploaded there, not copied too */
    if ((rc = eng_model_load_with(opts.model_path, &lp, &model, &err)))
        goto fail;
    st.tok = eng_model_tokenizer(model);
    if ((rc = eng_tokenize(st.tok, opts.prompt, strlen(opts.prompt),
                           !opts.no_bos && eng_tokenizer_add_bos(st.tok), false, &prompt,
                           &n_prompt, &err)))
        goto fail;
    if (n_prompt == 0) {
        sw_error_set(&err, SW_EINVAL, "the prompt is empty");
        goto fail;
    }
    eng_context_params cp = eng_context_default_params();
    cp.device = dev;
    cp.n_gpu_layers = opts.gpu_layers;
    cp.kv_policy = opts.policy;
    cp.kv_type = opts.kv_type;
    cp.reserve_fraction = opts.reserve;
    cp.n_threads = opts.n_threads;
    cp.n_ctx = opts.n_ctx;
    if (cp.n_ctx == 0) {
        int32_t want = (int32_t)n_prompt + opts.n_predict;
        int32_t train = eng_model_hparams(model)->n_ctx_train;
        cp.n_ctx = want < train ? (want > 512 ? want : 512) : train;
        if (cp.n_ctx > train)
            cp.n_ctx = train;
    }
    if ((rc = eng_context_create(model, &cp, &ctx, &err)))
        goto fail;

    eng_generate_params gp = eng_generate_default_params();
    gp.max_tokens = opts.n_predict;
    gp.sampling = opts.sampling;
    gp.top_logprobs = opts.top_logprobs;
    gp.ignore_eos = opts.ignore_eos;
    if (opts.json) {
        st.tokens = json_array();
        if (opts.top_logprobs)
            st.steps = json_array();
    }
    if (grammar && ((rc = eng_cs_vocab_create(st.tok, &cs_vocab, &err)) ||
                    (rc = eng_constraint_create(grammar, cs_vocab, &constraint, &err))))
        goto fail;
    gp.constraint = constraint;
    if ((rc = eng_generate(ctx, prompt, (int32_t)n_prompt, &gp, on_token, &st, &stats, &err)))
        goto fail;

    double prefill_tps = stats.prefill_seconds > 0 ? stats.n_prompt / stats.prefill_seconds : 0;
    double decode_tps = stats.n_generated > 1 && stats.decode_seconds > 0
                            ? (stats.n_generated - 1) / stats.decode_seconds
                            : 0;
    if (opts.json) {
        json_t *prompt_ids = json_array();
        size_t n_gen = json_array_size(st.tokens);
        int32_t *gen = sw_calloc(n_gen ? n_gen : 1, sizeof *gen);
        for (size_t i = 0; i < n_prompt; i++)
            json_array_append_new(prompt_ids, json_integer(prompt[i]));
        for (size_t i = 0; gen && i < n_gen; i++)
            gen[i] = (int32_t)json_integer_value(json_array_get(st.tokens, i));
        char *text = gen ? eng_detokenize(st.tok, gen, n_gen) : NULL;
        json_t *record = json_pack(
            "{s:s, s:o, s:o, s:s, s:i, s:i, s:f, s:f, s:s, s:i}", "model", opts.model_path,
            "prompt_tokens", prompt_ids, "tokens", st.tokens, "text", text ? text : "",
            "n_prompt_tokens", stats.n_prompt, "n_generated_tokens", stats.n_generated,
            "prefill_tokens_per_second", prefill_tps, "decode_tokens_per_second", decode_tps,
            "finish_reason", eng_finish_reason_name(stats.finish), "threads",
            eng_context_params_get(ctx)->n_threads);
        st.tokens = NULL;
        if (record && st.steps) {
            json_object_set_new(record, "top_logprobs", st.steps);
            st.steps = NULL;
        }
        char *dump = record ? json_dumps(record, JSON_COMPACT) : NULL;
        if (dump)
            printf("%s\n", dump);
        sw_free(dump);
        json_decref(record);
        sw_free(text);
        sw_free(gen);
    } else {
        char buf[64];
        size_t n = eng_detok_flush(&st.detok, buf, sizeof buf);
        fwrite(buf, 1, n, stdout);
        printf("\n");
        fflush(stdout);
        fprintf(stderr,
                "prompt %d tokens, %.1f tok/s; generated %d tokens, %.1f tok/s; finish: %s\n",
                stats.n_prompt, prefill_tps, stats.n_generated, decode_tps,
                eng_finish_reason_name(stats.finish));
    }
    status = 0;
    goto done;
fail:
    fprintf(stderr, "spillway run: %s\n", err.message[0] ? err.message : sw_strerror(rc));
done:
    json_decref(st.tokens);
    json_decref(st.steps);
    sw_free(prompt);
    eng_context_free(ctx);
    dev_close(dev);
    eng_constraint_free(constraint);
    eng_cs_vocab_free(cs_vocab);
    eng_model_free(model);
    eng_grammar_free(grammar);
    return status;
}
