/* cli_model_make.c - `spillway model make`: writes a synthetic GGUF of the
 * llama family
 * (modelgen/model_make.h) for tests, CI and the demo, so nobody needs to
 * download a model to try spillway. A preset (default tiny) is applied
 * first, then the shape options override it, whatever their order. */
#include "cli/cli.h"

#include "engine/embed.h"
#include "modelgen/model_make.h"
#include "quant/quant.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void model_make_usage(FILE *f)
{
    fprintf(f,
            "usage: spillway model make -o FILE [--preset tiny|small|1b|qwen3-tiny|phi3-tiny|\n"
            "                                             gemma3-tiny|qwen3moe-tiny|\n"
            "                                             qwen3moe-small|gpt-oss-tiny|\n"
            "                                             gpt-oss-small]\n"
            "                           [--dim N] [--layers N] [--heads N] [--kv-heads N]\n"
            "                           [--head-dim N] [--ffn N] [--vocab N] [--ctx N]\n"
            "                           [--type f32|f16|bf16|q8_0|q4_0|q2_k|q3_k|q4_k|\n"
            "                                  q5_k|q6_k|iq4_nl|iq4_xs|mxfp4|q3_k_m|q4_k_m|\n"
            "                                  q5_k_m]\n"
            "                           [--tied] [--seed S] [--name NAME] [--weight-scale F]\n"
            "                           [--arch llama|llama3|qwen2|qwen3|qwen3moe|phi3|gemma3|\n"
            "                                   gpt-oss]\n"
            "                           [--rope-base B] [--sliding-window N] [--swa-pattern N]\n"
            "                           [--pooling none|mean|cls|last|rank] [--add-eos]\n"
            "                           [--experts N] [--experts-used N]\n"
            "Writes a GGUF with deterministic pseudo-random weights and a built-in SPM\n"
            "vocabulary. --arch llama3: the llama layout with Llama 3's RoPE frequency\n"
            "factors as a rope_freqs.weight tensor, as converted Llama 3.1 files carry\n"
            "them (rope base 500000 unless --rope-base); qwen2: Q/K/V biases, NeoX RoPE, the\n"
            "qwen2 key prefix (rope base 1000000 unless --rope-base); qwen3: per-head RMS\n"
            "norms of Q and K (attn_q_norm / attn_k_norm), NeoX RoPE, the qwen3 key prefix\n"
            "with attention.key_length (rope base 1000000 unless --rope-base); phi3: fused\n"
            "attn_qkv and gate/up (one ffn_up of 2 x ffn rows), NeoX RoPE, the phi3 prefix;\n"
            "gemma3: qwen3's Q/K norms plus post_attention_norm / post_ffw_norm, GeGLU,\n"
            "no space prefix, the gemma3 prefix (rope base 1000000 unless --rope-base);\n"
            "--sliding-window N (gemma3): layers attend to the last N positions, all but\n"
            "every --swa-pattern-th (written when given; llama.cpp's default is 6); with\n"
            "llama or llama3 every layer attends to the last N (Mistral 7B v0.1's kind).\n"
            "qwen3moe: qwen3's attention, and per layer a router (ffn_gate_inp) and\n"
            "--experts N experts (default 8) of hidden size --ffn as 3-D ffn_gate_exps /\n"
            "ffn_up_exps / ffn_down_exps, --experts-used N (default 2) per token.\n"
            "gpt-oss: Q/K/V and output biases, a sink logit per head (attn_sinks),\n"
            "post_attention_norm before the experts, qwen3moe's experts with biases\n"
            "(router and experts), even layers sliding (--sliding-window, default 128),\n"
            "YaRN keys (factor 32 over 4096), the gpt-oss prefix (rope base 150000).\n"
            "--head-dim N: heads of N values (default dim / heads; Qwen3's are wider)\n"
            "--pooling P: none, mean, cls, last or rank written as ARCH.pooling_type, how\n"
            "an embedding pools the hidden states (default: no key); --add-eos sets\n"
            "tokenizer.ggml.add_eos_token (an embedding's input ends with EOS, as\n"
            "Qwen3-Embedding's files ask)\n"
            "--weight-scale F: every matrix's weights times F (default 1; norms and biases\n"
            "as they are): larger activations, sharper attention and next-token odds.\n"
            "(the same options always give the same file). q2_k..q6_k and iq4_xs need dim,\n"
            "ffn and heads x head dim to be multiples of 256. q4_k_m / q5_k_m: mostly\n"
            "q4_k / q5_k, with output, and attn_v / ffn_down in some layers, in q6_k (as\n"
            "Q4_K_M files are); q3_k_m: mostly q3_k, attn_v / ffn_down / attn_output in\n"
            "q4_k or q5_k, output in q6_k (as llama.cpp's Q3_K_M).\n"
            "presets: tiny  dim 64, 2 layers, 4 heads, 2 kv, ffn 128, vocab 512, f32 (default)\n"
            "         small dim 512, 8 layers, 8 heads, 4 kv, ffn 1536, vocab 32000, q8_0\n"
            "         1b    dim 2048, 22 layers, 32 heads, 4 kv, ffn 5632, vocab 32000, q8_0\n"
            "         qwen3-tiny  qwen3, dim 128, 2 layers, 4 heads of 64, 2 kv, ffn 384,\n"
            "               vocab 1024, f32, rope base 1e6\n"
            "         phi3-tiny   phi3, dim 128, 2 layers, 4 heads, 2 kv, ffn 384, vocab 1024,\n"
            "               f32\n"
            "         gemma3-tiny gemma3, dim 128, 2 layers (sliding window 8, pattern 2),\n"
            "               4 heads of 64, 2 kv, ffn 384, vocab 1024, f32, rope base 1e6,\n"
            "               final logit soft-cap 30\n"
            "         qwen3moe-tiny qwen3-tiny's shape as qwen3moe, 8 experts of ffn 128,\n"
            "               2 used\n"
            "         qwen3moe-small qwen3moe, dim 1024, 8 layers, 16 heads of 128, 4 kv,\n"
            "               64 experts of ffn 512, 8 used, vocab 32000, q8_0\n"
            "         gpt-oss-tiny qwen3-tiny's shape as gpt-oss, 8 experts of ffn 128,\n"
            "               2 used, sliding window 8\n"
            "         gpt-oss-small gpt-oss, dim 1024, 8 layers, 16 heads of 64, 8 kv,\n"
            "               32 experts of ffn 1024, 4 used, window 128, vocab 32000, q8_0\n");
}

static int model_make_int(const char *opt, const char *text, int32_t *out)
{
    char *end;
    errno = 0;
    long v = text ? strtol(text, &end, 10) : 0;
    if (!text || !*text || *end || errno || v <= 0 || v > INT32_MAX) {
        fprintf(stderr, "spillway model make: %s needs a positive integer, got '%s'\n", opt,
                text ? text : "");
        return -1;
    }
    *out = (int32_t)v;
    return 0;
}

int cli_model_make(int argc, char **argv)
{
    eng_model_make_params p = eng_model_make_default_params();
    const char *path = NULL;
    bool rope_base_set = false;
    sw_error err;

    /* The preset first, so that --dim etc. override it in any order. */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--preset") == 0) {
            if (i + 1 >= argc || eng_model_make_preset(argv[i + 1], &p) != 0) {
                fprintf(stderr,
                        "spillway model make: --preset needs tiny, small, 1b, qwen3-tiny, "
                        "phi3-tiny, gemma3-tiny, qwen3moe-tiny, qwen3moe-small, gpt-oss-tiny "
                        "or gpt-oss-small\n");
                return 2;
            }
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            model_make_usage(stdout);
            return 0;
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *opt = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        int32_t *target = NULL;
        if (strcmp(opt, "--add-eos") == 0) {
            p.add_eos = true;
            continue;
        }
        if (strcmp(opt, "--tied") == 0) {
            p.tied_output = true;
            continue;
        }
        if (strcmp(opt, "-o") != 0 && strcmp(opt, "--output") != 0 &&
            strcmp(opt, "--preset") != 0 && strcmp(opt, "--dim") != 0 &&
            strcmp(opt, "--layers") != 0 && strcmp(opt, "--heads") != 0 &&
            strcmp(opt, "--kv-heads") != 0 && strcmp(opt, "--ffn") != 0 &&
            strcmp(opt, "--head-dim") != 0 &&
            strcmp(opt, "--vocab") != 0 && strcmp(opt, "--ctx") != 0 &&
            strcmp(opt, "--type") != 0 && strcmp(opt, "--seed") != 0 &&
            strcmp(opt, "--name") != 0 && strcmp(opt, "--arch") != 0 &&
            strcmp(opt, "--rope-base") != 0 && strcmp(opt, "--sliding-window") != 0 &&
            strcmp(opt, "--weight-scale") != 0 &&
            strcmp(opt, "--swa-pattern") != 0 && strcmp(opt, "--experts") != 0 &&
            strcmp(opt, "--experts-used") != 0 && strcmp(opt, "--pooling") != 0) {
            fprintf(stderr, "spillway model make: unknown option '%s'\n", opt);
            model_make_usage(stderr);
            return 2;
        }
        if (!val) {
            fprintf(stderr, "spillway model make: %s needs a value\n", opt);
            return 2;
        }
        i++;
        if (strcmp(opt, "-o") == 0 || strcmp(opt, "--output") == 0) {
            path = val;
        } else if (strcmp(opt, "--preset") == 0) {
            /* applied above */
        } else if (strcmp(opt, "--type") == 0) {
            /* eng_type_from_name knows exactly the types the engine runs;
             * q4_k_m / q5_k_m are the mixed files (eng_model_make_mix) */
            p.mix = ENG_MIX_NONE;
            int type;
            if (strcmp(val, "q4_k_m") == 0) {
                type = ENG_TYPE_Q4_K;
                p.mix = ENG_MIX_Q4_K_M;
            } else if (strcmp(val, "q5_k_m") == 0) {
                type = ENG_TYPE_Q5_K;
                p.mix = ENG_MIX_Q5_K_M;
            } else if (strcmp(val, "q3_k_m") == 0) {
                type = ENG_TYPE_Q3_K;
                p.mix = ENG_MIX_Q3_K_M;
            } else {
                type = eng_type_from_name(val);
            }
            if (type < 0) {
                fprintf(stderr, "spillway model make: --type must be f32, f16, bf16, q8_0, "
                                "q4_0, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, iq4_xs, mxfp4, q3_k_m, "
                                "q4_k_m or q5_k_m, got '%s'\n", val);
                return 2;
            }
            p.weight_type = (uint32_t)type;
        } else if (strcmp(opt, "--seed") == 0) {
            char *end;
            errno = 0;
            unsigned long long seed = strtoull(val, &end, 0);
            if (!*val || *end || errno || val[0] == '-') {
                fprintf(stderr, "spillway model make: --seed needs an unsigned integer, "
                                "got '%s'\n", val);
                return 2;
            }
            p.seed = (uint64_t)seed;
        } else if (strcmp(opt, "--name") == 0) {
            p.name = val;
        } else if (strcmp(opt, "--pooling") == 0) {
            if (eng_pooling_from_name(val) < 0) {
                fprintf(stderr, "spillway model make: --pooling must be none, mean, cls, last "
                                "or rank, got '%s'\n", val);
                return 2;
            }
            p.pooling = val;
        } else if (strcmp(opt, "--arch") == 0) {
            if (strcmp(val, "llama") && strcmp(val, "llama3") && strcmp(val, "qwen2") &&
                strcmp(val, "qwen3") && strcmp(val, "phi3") && strcmp(val, "gemma3") &&
                strcmp(val, "qwen3moe") && strcmp(val, "gpt-oss")) {
                fprintf(stderr, "spillway model make: --arch must be llama, llama3, qwen2, "
                                "qwen3, qwen3moe, phi3, gemma3 or gpt-oss, got '%s'\n", val);
                return 2;
            }
            p.architecture = val;
            if (!rope_base_set)
                p.rope_freq_base = strcmp(val, "llama3") == 0 ? 500000.0f
                                   : strcmp(val, "qwen2") == 0 || strcmp(val, "qwen3") == 0 ||
                                           strcmp(val, "gemma3") == 0 ||
                                           strcmp(val, "qwen3moe") == 0
                                       ? 1000000.0f
                                   : strcmp(val, "gpt-oss") == 0 ? 150000.0f
                                                                 : 10000.0f;
        } else if (strcmp(opt, "--weight-scale") == 0) {
            char *end;
            double scale = strtod(val, &end);
            if (*end || !(scale > 0.0) || scale > 1e6) {
                fprintf(stderr, "spillway model make: --weight-scale needs a positive number "
                                "(at most 1e6)\n");
                return 2;
            }
            p.weight_scale = (float)scale;
        } else if (strcmp(opt, "--rope-base") == 0) {
            char *end;
            double base = strtod(val, &end);
            if (*end || !(base > 0.0)) {
                fprintf(stderr, "spillway model make: --rope-base needs a positive number\n");
                return 2;
            }
            p.rope_freq_base = (float)base;
            rope_base_set = true;
        } else {
            if (strcmp(opt, "--dim") == 0)
                target = &p.n_embd;
            else if (strcmp(opt, "--layers") == 0)
                target = &p.n_layer;
            else if (strcmp(opt, "--heads") == 0)
                target = &p.n_head;
            else if (strcmp(opt, "--kv-heads") == 0)
                target = &p.n_head_kv;
            else if (strcmp(opt, "--ffn") == 0)
                target = &p.n_ff;
            else if (strcmp(opt, "--head-dim") == 0)
                target = &p.head_dim;
            else if (strcmp(opt, "--vocab") == 0)
                target = &p.n_vocab;
            else if (strcmp(opt, "--sliding-window") == 0)
                target = &p.sliding_window;
            else if (strcmp(opt, "--swa-pattern") == 0)
                target = &p.sliding_window_pattern;
            else if (strcmp(opt, "--experts") == 0)
                target = &p.n_expert;
            else if (strcmp(opt, "--experts-used") == 0)
                target = &p.n_expert_used;
            else
                target = &p.n_ctx_train;
            if (model_make_int(opt, val, target) != 0)
                return 2;
        }
    }
    /* qwen3moe and gpt-oss without --experts / --experts-used: 8 experts,
     * 2 used; gpt-oss without --sliding-window: its 128 */
    if (p.architecture && strcmp(p.architecture, "gpt-oss") == 0 && p.sliding_window == 0)
        p.sliding_window = 128;
    if (p.architecture &&
        (strcmp(p.architecture, "qwen3moe") == 0 || strcmp(p.architecture, "gpt-oss") == 0)) {
        if (p.n_expert == 0)
            p.n_expert = p.n_expert_used > 8 ? p.n_expert_used : 8;
        if (p.n_expert_used == 0)
            p.n_expert_used = p.n_expert < 2 ? p.n_expert : 2;
    }
    if (!path) {
        fprintf(stderr, "spillway model make: -o FILE is required\n");
        model_make_usage(stderr);
        return 2;
    }
    sw_error_clear(&err);
    if (eng_model_make_validate(&p, &err) != 0) {
        fprintf(stderr, "spillway %s\n", err.message);
        return 2;
    }
    if (eng_model_make(&p, path, &err) != 0) {
        fprintf(stderr, "spillway %s\n", err.message);
        return 1;
    }
    struct stat st;
    long long size = stat(path, &st) == 0 ? (long long)st.st_size : -1;
    const eng_type_traits *tr = eng_type_traits_get(p.weight_type);
    int64_t n_params = eng_model_make_n_params(&p);
    char experts[64] = "";
    if (p.n_expert > 0)
        snprintf(experts, sizeof experts, ", %d experts (%d used)", p.n_expert, p.n_expert_used);
    printf("wrote %s: %lld bytes, %" PRId64 " parameters (%.1fM), %s, dim %d, %d layers, "
           "%d heads / %d kv, ffn %d, vocab %d%s, seed %" PRIu64 "%s\n",
           path, size, n_params, (double)n_params / 1e6, p.mix == ENG_MIX_Q4_K_M   ? "q4_k_m"
           : p.mix == ENG_MIX_Q5_K_M ? "q5_k_m"
           : tr                      ? tr->name
                                     : "?",
           p.n_embd,
           p.n_layer, p.n_head, p.n_head_kv, p.n_ff, p.n_vocab, p.tied_output ? ", tied" : "",
           p.seed, experts);
    return 0;
}
