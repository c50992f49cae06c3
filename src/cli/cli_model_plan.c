/* cli_model_plan.c - `spillway model plan`: the memory budget of a model on
 * a device (DESIGN.md, Memory model) - weights, KV per token, workspace,
 * reserve, free memory, whether the requested shape fits, and the largest
 * context, sequence count and GPU layer count that would. The numbers come
 * from eng_plan_compute, the function admission uses at run time.
 */
#include "cli/cli.h"

#include "common/alloc.h"
#include "common/units.h"
#include "device/device.h"
#include "engine/model.h"
#include "engine/plan.h"

#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *out)
{
    fprintf(out,
            "usage: spillway model plan -m FILE [--device D] [--sim-capacity BYTES]\n"
            "                           [--gpu-layers N] [--ctx C] [--seqs S] [--reserve P]\n"
            "                           [--batch B] [--threads T] [--json]\n"
            "  --device D        cpu (default), sim-gpu:NAME, cuda:N\n"
            "  --sim-capacity B  plan against an empty sim-gpu pool of this size when none is in\n"
            "                    use (e.g. 512MiB); without it an existing pool is read. A plan\n"
            "                    creates no pool\n"
            "  --gpu-layers N    layers on the device: -1 = all (default), 0..n_layer = split\n"
            "  --ctx C           tokens per sequence (default 2048)\n"
            "  --seqs S          sequences at once (default 1)\n"
            "  --reserve P       share of the device never handed out (default 0.10)\n"
            "  --kv-type T       f16 (default) | q8_0 | q4_0 | f32: the KV cache's elements\n"
            "A file the engine does not run (another family) is planned from its metadata as a\n"
            "llama-server worker's: weights, KV per token, the cache of -c CTX*SEQS -np SEQS.\n");
}

int cli_model_plan(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"model", required_argument, 0, 'm'},    {"device", required_argument, 0, 'd'},
        {"sim-capacity", required_argument, 0, 'C'}, {"gpu-layers", required_argument, 0, 'l'},
        {"ctx", required_argument, 0, 'c'},      {"seqs", required_argument, 0, 's'},
        {"reserve", required_argument, 0, 'r'},  {"batch", required_argument, 0, 'b'},
        {"threads", required_argument, 0, 't'},  {"json", no_argument, 0, 'j'},
        {"kv-type", required_argument, 0, 'k'},
        {"help", no_argument, 0, 'h'},           {0, 0, 0, 0},
    };
    const char *path = NULL, *spec = "cpu";
    unsigned long long sim_capacity = 0;
    eng_plan_params pp = eng_plan_default_params();
    bool json = false;
    int c;

    optind = 1;
    while ((c = getopt_long(argc, argv, "m:d:c:s:r:b:t:k:jh", longopts, NULL)) != -1) {
        switch (c) {
        case 'm': path = optarg; break;
        case 'd': spec = optarg; break;
        case 'C':
            if (cli_parse_bytes(optarg, &sim_capacity)) {
                fprintf(stderr, "spillway model plan: bad size '%s'\n", optarg);
                return 2;
            }
            break;
        case 'l': pp.n_gpu_layers = atoi(optarg); break;
        case 'c': pp.n_ctx = atoi(optarg); break;
        case 's': pp.n_seqs = atoi(optarg); break;
        case 'r': pp.reserve_fraction = (float)atof(optarg); break;
        case 'b': pp.n_batch = atoi(optarg); break;
        case 't': pp.n_threads = atoi(optarg); break;
        case 'j': json = true; break;
        case 'k':
            if (cli_parse_kv_type("model plan", optarg, &pp.kv_type))
                return 2;
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!path) {
        usage(stderr);
        return 2;
    }

    eng_model *model = NULL;
    dev_device *dev = NULL;
    dev_memory mem;
    eng_plan plan;
    sw_error err;
    int status = 1;
    /* A plan creates nothing: a sim-gpu pool is looked at if it exists
     * (and is in use), else planned as an empty pool of --sim-capacity. */
    bool sim = !strncmp(spec, "sim-gpu:", 8);
    dev_options opts = {.sim_capacity_bytes = sim_capacity, .sim_no_create = sim};
    bool planned_pool = false; /* no pool: an empty one of sim_capacity */

    /* only the metadata is needed: no weight is copied or read */
    eng_model_load_params lp = eng_model_load_default_params();
    lp.copy_weights = false;
    if (eng_model_load_with(path, &lp, &model, &err)) {
        /* a file the engine does not run (another architecture, a tensor
         * type it lacks): the figures of a llama-server worker of it */
        if (err.code == SW_EUNSUPPORTED)
            return cli_model_plan_books(path, &pp, json, err.message);
        goto fail;
    }
    int rc = dev_open(spec, &opts, &dev, &err);
    if (rc == SW_ENOTFOUND && sim && sim_capacity > 0) {
        planned_pool = true;
        memset(&mem, 0, sizeof mem);
        mem.total_bytes = mem.free_bytes = sim_capacity;
    } else if (rc == SW_ENOTFOUND && sim) {
        sw_error_set(&err, SW_ENOTFOUND,
                     "%s (simulated): no such pool; pass --sim-capacity BYTES to plan against "
                     "an empty pool of that size (nothing is created)",
                     spec);
        goto fail;
    } else if (rc || dev_memory_info(dev, &mem, &err)) {
        goto fail;
    }
    dev_kind kind = dev ? dev_get_kind(dev) : DEV_KIND_SIM_GPU;
    pp.weights_stay_mapped = kind == DEV_KIND_CPU;
    pp.device_is_cuda = kind == DEV_KIND_CUDA;
    if (eng_plan_compute(model, &pp, mem.total_bytes, mem.free_bytes, &plan, &err))
        goto fail;

    const eng_hparams *hp = eng_model_hparams(model);
    if (json) {
        json_t *rec = json_pack(
            "{s:s, s:s, s:b, s:i, s:i, s:i, s:i, s:f, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I,"
            " s:I, s:I, s:b, s:i, s:i, s:i, s:i, s:i, s:I}",
            "model", path, "device", dev ? dev_spec(dev) : spec, "simulated",
            dev ? dev_is_simulated(dev) : true, "layers",
            hp->n_layer, "device_layers", plan.n_device_layers, "ctx", pp.n_ctx, "seqs",
            pp.n_seqs, "reserve_fraction", (double)pp.reserve_fraction, "weights_device_bytes",
            (json_int_t)plan.weights_device_bytes, "weights_host_bytes",
            (json_int_t)plan.weights_host_bytes, "kv_bytes_per_token_device",
            (json_int_t)plan.kv_bytes_per_token_device, "kv_bytes_per_token_host",
            (json_int_t)plan.kv_bytes_per_token_host, "kv_device_bytes",
            (json_int_t)plan.kv_device_bytes, "workspace_bytes", (json_int_t)plan.workspace_bytes,
            "device_bytes", (json_int_t)plan.device_bytes, "capacity_bytes",
            (json_int_t)plan.capacity_bytes, "free_bytes", (json_int_t)plan.free_bytes,
            "reserve_bytes", (json_int_t)plan.reserve_bytes, "kv_host_bytes",
            (json_int_t)plan.kv_host_bytes, "fits", plan.fits, "max_ctx", plan.max_ctx,
            "max_seqs", plan.max_seqs, "max_gpu_layers", plan.max_gpu_layers, "experts",
            hp->n_expert, "experts_used", hp->n_expert_used, "decode_read_bytes",
            (json_int_t)eng_model_decode_read_bytes(model));
        /* sliding-window layers (0 without): their share of the per-token
         * figures and the most blocks of it a sequence holds, against the
         * blocks of the whole context */
        json_object_set_new(rec, "kv_sliding_bytes_per_token_device",
                            json_integer((json_int_t)plan.kv_sliding_bytes_per_token_device));
        json_object_set_new(rec, "kv_sliding_bytes_per_token_host",
                            json_integer((json_int_t)plan.kv_sliding_bytes_per_token_host));
        json_object_set_new(rec, "kv_sliding_blocks_max", json_integer(plan.kv_sliding_blocks_max));
        json_object_set_new(rec, "kv_blocks_per_seq", json_integer(plan.kv_blocks_per_seq));
        json_object_set_new(rec, "sliding_window", json_integer(hp->n_swa));
        json_object_set_new(rec, "kv_type", json_string(eng_kv_type_name(pp.kv_type)));
        /* the same file as a llama-server worker's (its cache, not its
         * compute buffers): what the router's books count there */
        json_object_set_new(rec, "llama_server_kv_bytes",
                            json_integer((json_int_t)cli_model_plan_server_kv(path, &pp)));
        /* true: no such pool, planned as an empty one of --sim-capacity */
        json_object_set_new(rec, "pool_planned", json_boolean(planned_pool));
        char *text = json_dumps(rec, JSON_COMPACT);
        printf("%s\n", text);
        sw_free(text);
        json_decref(rec);
    } else {
        char a[32], b[32], d[32];
        printf("model %s: %d layers, dim %d, %d heads / %d kv, vocab %d\n", path, hp->n_layer,
               hp->n_embd, hp->n_head, hp->n_head_kv, hp->n_vocab);
        sw_format_bytes(mem.total_bytes, a, sizeof a);
        sw_format_bytes(mem.free_bytes, b, sizeof b);
        printf("device %s%s: %s total, %s free%s\n", dev ? dev_spec(dev) : spec,
               !dev || dev_is_simulated(dev) ? " (simulated GPU)" : "", a, b,
               planned_pool ? " (no such pool: planned as an empty one, not created)" : "");
        printf("profile: %d of %d layers on the device (%s), ctx %d x %d sequence(s)\n",
               plan.n_device_layers, hp->n_layer,
               plan.n_device_layers == hp->n_layer ? "full"
               : plan.n_device_layers == 0          ? "cpu"
                                                    : "split",
               pp.n_ctx, pp.n_seqs);
        sw_format_bytes(plan.weights_device_bytes, a, sizeof a);
        sw_format_bytes(plan.weights_host_bytes, b, sizeof b);
        printf("  weights        %12s on the device, %s in host memory%s\n", a, b,
               pp.weights_stay_mapped ? " (mapped)" : "");
        if (hp->n_expert > 0) {
            /* every expert is held; a token reads only the ones it is routed to */
            sw_format_bytes(eng_model_weights_bytes(model), a, sizeof a);
            sw_format_bytes(eng_model_decode_read_bytes(model), b, sizeof b);
            printf("  experts        %12d per layer, %d used per token: all held (%s of "
                   "weights), %s read per decoded token\n", hp->n_expert, hp->n_expert_used, a, b);
        }
        printf("  kv per token   %12llu bytes on the device, %llu in host memory (%s)\n",
               (unsigned long long)plan.kv_bytes_per_token_device,
               (unsigned long long)plan.kv_bytes_per_token_host, eng_kv_type_name(pp.kv_type));
        if (plan.kv_sliding_blocks_max > 0) {
            /* a sliding layer's share is held for the window only: past
             * its ring a token adds only the global layers' share */
            unsigned long long sliding = plan.kv_sliding_bytes_per_token_device +
                                         plan.kv_sliding_bytes_per_token_host;
            unsigned long long all =
                plan.kv_bytes_per_token_device + plan.kv_bytes_per_token_host;
            printf("  sliding layers %12llu of those bytes per token, held for the window of %d "
                   "only (a ring of at most %d of a sequence's %d blocks); past it a token adds "
                   "%llu bytes\n",
                   sliding, hp->n_swa, plan.kv_sliding_blocks_max, plan.kv_blocks_per_seq,
                   all - sliding);
        }
        sw_format_bytes(plan.kv_device_bytes, a, sizeof a);
        sw_format_bytes(plan.kv_host_bytes, b, sizeof b);
        printf("  kv for ctx     %12s on the device, %s in host memory: in use by requests,\n"
               "                 or kept by the prefix cache (evictable, never more)\n", a, b);
        sw_format_bytes(plan.workspace_bytes, a, sizeof a);
        printf("  workspace      %12s%s\n", a, plan.n_device_layers ? " (device)" : " (host)");
        sw_format_bytes(plan.reserve_bytes, a, sizeof a);
        printf("  reserve        %12s (%.0f%% of capacity, never handed out)\n", a,
               (double)pp.reserve_fraction * 100.0);
        sw_format_bytes(plan.device_bytes, a, sizeof a);
        sw_format_bytes(plan.free_bytes > plan.reserve_bytes ? plan.free_bytes - plan.reserve_bytes : 0, d,
              sizeof d);
        printf("  needed         %12s of %s usable: %s\n", a, d, plan.fits ? "fits" : "DOES NOT FIT");
        printf("largest that fit: ctx %d (with %d seqs), %d seqs (of ctx %d), %d gpu layers\n",
               plan.max_ctx, pp.n_seqs, plan.max_seqs, pp.n_ctx, plan.max_gpu_layers);
        sw_format_bytes(cli_model_plan_server_kv(path, &pp), a, sizeof a);
        printf("as a llama-server worker (-c %lld -np %d): kv %s\n",
               (long long)pp.n_ctx * pp.n_seqs, pp.n_seqs, a);
    }
    status = plan.fits ? 0 : 3;
    goto done;
fail:
    fprintf(stderr, "spillway model plan: %s\n", err.message);
done:
    dev_close(dev);
    eng_model_free(model);
    return status;
}
