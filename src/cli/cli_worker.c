/* cli_worker.c - `spillway worker`: parses the command line into
 * wk_options and runs the worker (src/worker). */
#include "cli/cli.h"

#include "api/api.h"
#include "engine/embed.h"
#include "worker/worker.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *out)
{
    fprintf(out,
            "usage: spillway worker --model FILE --listen unix:PATH|HOST:PORT|PORT [options]\n"
            "  -m, --model FILE        GGUF model\n"
            "      --listen ADDR       unix:PATH, HOST:PORT, or PORT (127.0.0.1); port 0 picks one\n"
            "      --device D          cpu (default: host memory), sim-gpu:NAME, cuda:N\n"
            "      --sim-capacity B    capacity when creating a sim-gpu pool (e.g. 512MiB)\n"
            "      --gpu-layers N      layers on the device: -1 = all (default), N = split\n"
            "      --ctx-limit C       tokens per sequence (default: min(trained, 4096))\n"
            "      --max-seqs S        sequences served at once (default 4, at most 64)\n"
            "      --reserve F         share of the device never used (default 0.10)\n"
            "      --policy P          reserve (default) | grow: when KV memory is taken\n"
            "      --kv-type T         f16 (default) | q8_0 | q4_0 | f32: the KV cache's elements\n"
            "  -t, --threads T         threads (default: one per core)\n"
            "      --prefill-chunk N   prompt tokens per prefill chunk, one newcomer per step (default 64)\n"
            "      --max-queue N       requests waiting for a slot (default 64)\n"
            "      --max-body B        largest request body (default 1MiB)\n"
            "      --http-timeout S    per-connection read/write time-out (default 30)\n"
            "      --chat-template F   chatml, llama2, llama3, llama3.1, mistral, zephyr, phi3,\n"
            "                          gemma, phi4, qwen3, qwen3-thinking, deepseek-r1, harmony\n"
            "                          (gpt-oss)\n"
            "                          (default: detected from the model's template)\n"
            "      --reasoning-format R  auto (default) | deepseek | none: a thinking\n"
            "                          family's thought as reasoning_content (deepseek; auto\n"
            "                          does so for the families that think) or left in the\n"
            "                          content (none); a request's reasoning_format wins\n"
            "      --model-id ID       the id it answers to as \"model\" (default: the file's\n"
            "                          general.name, else its file name)\n"
            "      --alias NAME        another name it answers to as \"model\" (repeatable,\n"
            "                          or a comma list; /v1/models lists them)\n"
            "      --no-calibrate      skip the start-up measurement of the prefill/decode\n"
            "                          rates (/health has none until requests measure them)\n"
            "      --no-prefix-cache   compute every prompt whole (default: finished requests'\n"
            "                          KV blocks are kept, evictable, for prompts that start\n"
            "                          the same)\n"
            "      --shared-device     other workers allocate on this device: keep no KV\n"
            "                          block after its requests end (the router says so)\n"
            "      --cors-origins L    origins a browser page may call from: * (default),\n"
            "                          \"\" for none, or a list such as https://app.example\n"
            "      --pooling P         mean | cls | last: how /v1/embeddings pools a text's\n"
            "                          hidden states (default: the file's <arch>.pooling_type;\n"
            "                          a file that declares none serves no embeddings)\n"
            "Exit status: 0 after SIGTERM/SIGINT (active requests finish first),\n"
            "1 when the model or device cannot be set up, 2 for bad options,\n"
            "75 after an unrecoverable device error (restart the worker).\n");
}

static int number(const char *text, double lo, double hi, double *out)
{
    char *end;
    double v = strtod(text, &end);
    if (end == text || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "spillway worker: '%s' is not a number in [%g, %g]\n", text, lo, hi);
        return 2;
    }
    *out = v;
    return 0;
}

#define CLI_WORKER_MAX_ALIASES 16

int cli_worker_main(int argc, char **argv)
{
    const char *aliases[CLI_WORKER_MAX_ALIASES];
    size_t n_aliases = 0;
    enum { OPT_LISTEN = 256, OPT_DEVICE, OPT_SIM_CAPACITY, OPT_GPU_LAYERS, OPT_CTX, OPT_SEQS,
           OPT_RESERVE, OPT_POLICY, OPT_CHUNK, OPT_QUEUE, OPT_BODY, OPT_TIMEOUT, OPT_CHAT,
           OPT_NO_CALIBRATE, OPT_MODEL_ID, OPT_NO_PREFIX_CACHE, OPT_KV_TYPE, OPT_SHARED_DEVICE,
           OPT_REASONING, OPT_CORS, OPT_ALIAS, OPT_POOLING };
    static const struct option longopts[] = {
        {"model", required_argument, 0, 'm'},
        {"threads", required_argument, 0, 't'},
        {"listen", required_argument, 0, OPT_LISTEN},
        {"device", required_argument, 0, OPT_DEVICE},
        {"sim-capacity", required_argument, 0, OPT_SIM_CAPACITY},
        {"gpu-layers", required_argument, 0, OPT_GPU_LAYERS},
        {"ctx-limit", required_argument, 0, OPT_CTX},
        {"max-seqs", required_argument, 0, OPT_SEQS},
        {"reserve", required_argument, 0, OPT_RESERVE},
        {"policy", required_argument, 0, OPT_POLICY},
        {"prefill-chunk", required_argument, 0, OPT_CHUNK},
        {"max-queue", required_argument, 0, OPT_QUEUE},
        {"max-body", required_argument, 0, OPT_BODY},
        {"http-timeout", required_argument, 0, OPT_TIMEOUT},
        {"chat-template", required_argument, 0, OPT_CHAT},
        {"reasoning-format", required_argument, 0, OPT_REASONING},
        {"no-calibrate", no_argument, 0, OPT_NO_CALIBRATE},
        {"no-prefix-cache", no_argument, 0, OPT_NO_PREFIX_CACHE},
        {"kv-type", required_argument, 0, OPT_KV_TYPE},
        {"shared-device", no_argument, 0, OPT_SHARED_DEVICE},
        {"cors-origins", required_argument, 0, OPT_CORS},
        {"model-id", required_argument, 0, OPT_MODEL_ID},
        {"alias", required_argument, 0, OPT_ALIAS},
        {"pooling", required_argument, 0, OPT_POOLING},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    wk_options o = wk_default_options();
    unsigned long long bytes;
    double v = 0;
    int c;

    optind = 1;
    while ((c = getopt_long(argc, argv, "m:t:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'm': o.model_path = optarg; break;
        case OPT_LISTEN: o.listen = optarg; break;
        case OPT_DEVICE: o.device = optarg; break;
        case OPT_SIM_CAPACITY:
        case OPT_BODY:
            if (cli_parse_bytes(optarg, &bytes)) {
                fprintf(stderr, "spillway worker: bad size '%s'\n", optarg);
                return 2;
            }
            if (c == OPT_BODY)
                o.max_body_bytes = (size_t)bytes;
            else
                o.sim_capacity = bytes;
            break;
        case 't':
            if (number(optarg, 0, 1024, &v))
                return 2;
            o.threads = (int32_t)v;
            break;
        case OPT_GPU_LAYERS:
            if (number(optarg, -1, 100000, &v))
                return 2;
            o.gpu_layers = (int32_t)v;
            break;
        case OPT_CTX:
            if (number(optarg, 0, 1 << 24, &v))
                return 2;
            o.ctx_limit = (int32_t)v;
            break;
        case OPT_SEQS:
            if (number(optarg, 1, 64, &v))
                return 2;
            o.max_seqs = (int32_t)v;
            break;
        case OPT_RESERVE:
            if (number(optarg, 0, 0.99, &v))
                return 2;
            o.reserve = (float)v;
            break;
        case OPT_CHUNK:
            if (number(optarg, 1, 1 << 20, &v))
                return 2;
            o.prefill_chunk = (int32_t)v;
            break;
        case OPT_QUEUE:
            if (number(optarg, 0, 1 << 20, &v))
                return 2;
            o.max_queue = (int32_t)v;
            break;
        case OPT_TIMEOUT:
            if (number(optarg, 1, 86400, &v))
                return 2;
            o.http_timeout_s = (int)v;
            break;
        case OPT_POLICY:
            if (strcmp(optarg, "reserve") == 0) {
                o.policy = ENG_KV_RESERVE;
            } else if (strcmp(optarg, "grow") == 0) {
                o.policy = ENG_KV_GROW;
            } else {
                fprintf(stderr, "spillway worker: --policy is reserve or grow\n");
                return 2;
            }
            break;
        case OPT_CHAT: o.chat_template = optarg; break;
        case OPT_REASONING:
            if (eng_reasoning_format_from_name(optarg, &o.reasoning_format) != SW_OK) {
                fprintf(stderr, "spillway worker: --reasoning-format is auto, deepseek or none\n");
                return 2;
            }
            break;
        case OPT_MODEL_ID: o.model_id = optarg; break;
        case OPT_POOLING:
            o.pooling = eng_pooling_from_name(optarg);
            if (o.pooling != ENG_POOLING_MEAN && o.pooling != ENG_POOLING_CLS &&
                o.pooling != ENG_POOLING_LAST) {
                fprintf(stderr, "spillway worker: --pooling is mean, cls or last\n");
                return 2;
            }
            break;
        case OPT_ALIAS:
            /* repeatable, each a name or a comma list (split in place) */
            for (char *name = strtok(optarg, ","); name; name = strtok(NULL, ",")) {
                if (n_aliases == CLI_WORKER_MAX_ALIASES || !name[0] || strlen(name) >= 256 ||
                    !api_model_id_valid(name, strlen(name))) {
                    fprintf(stderr, "spillway worker: --alias: at most %d names of 1..255 bytes "
                                    "of printable UTF-8\n", CLI_WORKER_MAX_ALIASES);
                    return 2;
                }
                aliases[n_aliases++] = name;
            }
            break;
        case OPT_NO_CALIBRATE: o.skip_calibration = true; break;
        case OPT_NO_PREFIX_CACHE: o.prefix_cache = false; break;
        case OPT_SHARED_DEVICE: o.shared_device = true; break;
        case OPT_CORS:
            if (!api_cors_list_valid(optarg)) {
                fprintf(stderr, "spillway worker: --cors-origins: expected *, \"\" or origins "
                                "such as https://app.example, not '%s'\n", optarg);
                return 2;
            }
            o.cors_origins = optarg;
            break;
        case OPT_KV_TYPE:
            if (cli_parse_kv_type("worker", optarg, &o.kv_type))
                return 2;
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!o.model_path || !o.listen) {
        fprintf(stderr, "spillway worker: --model and --listen are required\n");
        usage(stderr);
        return 2;
    }
    if (o.model_id && (!o.model_id[0] || strlen(o.model_id) >= 256 ||
                       !api_model_id_valid(o.model_id, strlen(o.model_id)))) {
        fprintf(stderr, "spillway worker: --model-id: 1..255 bytes of printable UTF-8\n");
        return 2;
    }
    o.aliases = aliases;
    o.n_aliases = n_aliases;
    return wk_serve(&o);
}
