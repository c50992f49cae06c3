/* testutil.c - see testutil.h. */
#include "testutil.h"

#include "common/alloc.h"
#include "engine/model.h"
#include "grammar/constrain.h"
#include "quant/quant.h"
#include "text/tokenizer.h"

#include <jansson.h>

#include <stdbool.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* path = root/relative when it exists, else NULL after the SKIP line; root
 * from the environment variable env, or default_root. */
static const char *existing_path(const char *env, const char *default_root,
                                 const char *relative, const char *what)
{
    static char path[4096];
    const char *root = getenv(env);
    struct stat st;
    if (!root || !*root)
        root = default_root;
    snprintf(path, sizeof path, "%s/%s", root, relative);
    if (stat(path, &st) != 0) {
        print_message("SKIP: this test needs %s (%s); it is absent\n", path, what);
        skip();
        return NULL;
    }
    return path;
}

const char *tu_shared_path(const char *relative)
{
    return existing_path("SPILLWAY_SHARED", "../shared", relative,
                         "the shared models and vocabularies beside the checkout");
}

const char *tu_data_path(const char *relative)
{
    return existing_path("SPILLWAY_TEST_DATA", "tests/data", relative,
                         "test data committed under tests/data; SPILLWAY_TEST_DATA points at it");
}

bool tu_collect_step(void *user, const eng_generate_step *step)
{
    tu_steps *c = user;
    if (c->n == 0)
        c->first = *step;
    if (c->n < TU_STEPS_MAX)
        c->tokens[c->n++] = step->token;
    return true;
}

int32_t *tu_json_ids(const json_t *array, size_t *n)
{
    *n = json_array_size(array);
    int32_t *ids = sw_calloc(*n ? *n : 1, sizeof *ids);
    assert_non_null(ids);
    for (size_t i = 0; i < *n; i++)
        ids[i] = (int32_t)json_integer_value(json_array_get(array, i));
    return ids;
}

const char *tu_tmp_path(const char *name)
{
    static char path[4096];
    const char *root = getenv("SPILLWAY_TEST_TMP");
    if (!root || !*root)
        root = "/tmp";
    mkdir(root, 0755);
    snprintf(path, sizeof path, "%s/%ld-%s", root, (long)getpid(), name);
    return path;
}

char *tu_read_file(const char *path, size_t *len_out)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long size;
    if (!f)
        return NULL;
    if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0)
        goto fail;
    buf = sw_malloc((size_t)size + 1);
    if (!buf || fread(buf, 1, (size_t)size, f) != (size_t)size)
        goto fail;
    buf[size] = '\0';
    if (len_out)
        *len_out = (size_t)size;
    fclose(f);
    return buf;
fail:
    sw_free(buf);
    fclose(f);
    return NULL;
}

const char *tu_spillway_bin(void)
{
    const char *bin = getenv("SPILLWAY_BIN");
    return bin && *bin ? bin : NULL;
}

int tu_run_capture(char *const argv[], int timeout_s, char **stdout_out, int *exit_status)
{
    int pipefd[2];
    pid_t pid;
    size_t len = 0, cap = 4096;
    char *buf = sw_malloc(cap);
    time_t deadline = time(NULL) + timeout_s;
    int status = 0;

    if (!buf || pipe(pipefd) != 0) {
        sw_free(buf);
        return -1;
    }
    pid = fork();
    if (pid < 0) {
        sw_free(buf);
        return -1;
    }
    if (pid == 0) {
        dup2(pipefd[1], 1);
        close(pipefd[0]);
        close(pipefd[1]);
        execv(argv[0], argv);
        _exit(127);
    }
    close(pipefd[1]);
    fcntl(pipefd[0], F_SETFL, O_NONBLOCK);
    for (;;) {
        ssize_t n;
        if (len + 1024 > cap) {
            char *bigger = sw_realloc(buf, cap * 2);
            if (!bigger)
                break;
            buf = bigger;
            cap *= 2;
        }
        n = read(pipefd[0], buf + len, cap - len - 1);
        if (n > 0) {
            len += (size_t)n;
            continue;
        }
        if (n == 0)
            break;
        if (errno != EAGAIN && errno != EINTR)
            break;
        if (time(NULL) > deadline) {
            kill(pid, SIGKILL);
            break;
        }
        usleep(10000);
    }
    close(pipefd[0]);
    waitpid(pid, &status, 0);
    buf[len] = '\0';
    *stdout_out = buf;
    *exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return 0;
}

/* ---- tokenizer helpers ---------------------------------------------------- */

size_t tu_tokenize(const eng_tokenizer *tok, const char *text, size_t len, bool add_bos,
                       bool parse_special, int32_t **ids)
{
    size_t n = 0;
    sw_error err = {0};
    int rc = eng_tokenize(tok, text, len, add_bos, parse_special, ids, &n, &err);
    if (rc)
        fail_msg("tokenize failed: %s", err.message);
    assert_non_null(*ids);
    return n;
}

void tu_assert_ids_equal(const int32_t *got, size_t n_got, const int32_t *want,
                             size_t n_want, const char *what)
{
    if (n_got == n_want && memcmp(got, want, n_got * sizeof *got) == 0)
        return;
    print_error("token mismatch for %s\n  got: ", what);
    for (size_t i = 0; i < n_got; i++)
        print_error(" %d", got[i]);
    print_error("\n want:");
    for (size_t i = 0; i < n_want; i++)
        print_error(" %d", want[i]);
    print_error("\n");
    fail();
}

bool tu_valid_utf8(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned c = p[i];
        size_t len;
        unsigned cp;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            len = 2, cp = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            len = 3, cp = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            len = 4, cp = c & 0x07;
        } else {
            return false;
        }
        if (n - i < len)
            return false;
        for (size_t k = 1; k < len; k++) {
            if ((p[i + k] & 0xC0) != 0x80)
                return false;
            cp = (cp << 6) | (p[i + k] & 0x3F);
        }
        if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
            cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return false;
        i += len;
    }
    return true;
}

/* ---- tokenizer test vectors (../shared/vocab/X.gguf.inp / .out) ---------- */

void tu_vocab_cases_free(tu_vocab_case *cases, size_t n)
{
    for (size_t i = 0; cases && i < n; i++) {
        sw_free(cases[i].text);
        sw_free(cases[i].ids);
    }
    sw_free(cases);
}

tu_vocab_case *tu_vocab_cases_load(const char *gguf_path, size_t *n_out)
{
    static const char sep[] = "\n__ggml_vocab_test__\n";
    const size_t sep_len = sizeof sep - 1;
    char inp_path[4200], out_path[4200];
    size_t inp_len, out_len, n = 0;
    snprintf(inp_path, sizeof inp_path, "%s.inp", gguf_path);
    snprintf(out_path, sizeof out_path, "%s.out", gguf_path);
    char *inp = tu_read_file(inp_path, &inp_len);
    char *out = tu_read_file(out_path, &out_len);
    tu_vocab_case *cases = sw_calloc(256, sizeof *cases);
    assert_non_null(inp);
    assert_non_null(out);
    assert_non_null(cases);

    char *cursor = inp, *inp_end = inp + inp_len, *line = out;
    while (cursor < inp_end) {
        char *end = memmem(cursor, (size_t)(inp_end - cursor), sep, sep_len);
        char *nl = strchr(line, '\n');
        assert_non_null(end);
        assert_non_null(nl);
        assert_true(n < 256);
        *nl = '\0';
        tu_vocab_case *c = &cases[n++];
        c->len = (size_t)(end - cursor);
        c->text = sw_strndup(cursor, c->len);
        c->ids = sw_calloc(1024, sizeof *c->ids);
        assert_non_null(c->text);
        assert_non_null(c->ids);
        for (char *q = line;;) {
            char *next;
            long v = strtol(q, &next, 10);
            if (next == q)
                break;
            assert_true(c->n_ids < 1024);
            c->ids[c->n_ids++] = (int32_t)v;
            q = next;
        }
        line = nl + 1;
        cursor = end + sep_len;
    }
    sw_free(inp);
    sw_free(out);
    *n_out = n;
    return cases;
}

float *tu_prompt_logits(const char *path, int32_t *n_vocab_out)
{
    eng_model *model;
    eng_context *ctx;
    sw_error err;
    if (eng_model_load(path, &model, &err))
        fail_msg("load %s: %s", path, err.message);
    eng_context_params cp = eng_context_default_params();
    cp.n_ctx = 64;
    cp.n_threads = 2;
    cp.kv_type = ENG_TYPE_F32;
    assert_int_equal(eng_context_create(model, &cp, &ctx, &err), SW_OK);
    int32_t n_vocab = eng_model_hparams(model)->n_vocab;
    int32_t tokens[20];
    for (int i = 0; i < 20; i++)
        tokens[i] = 3 + (i * 37) % (n_vocab - 3);
    float *logits = sw_malloc(sizeof(float) * (size_t)n_vocab);
    assert_int_equal(eng_decode(ctx, 0, tokens, 20, logits, &err), SW_OK);
    eng_context_free(ctx);
    eng_model_free(model);
    *n_vocab_out = n_vocab;
    return logits;
}

eng_cs_vocab *tu_byte_vocab(void)
{
    static char bytes[256];
    const char *pieces[257];
    size_t lens[257];
    for (int i = 0; i < 256; i++) {
        bytes[i] = (char)i;
        pieces[i] = &bytes[i];
        lens[i] = 1;
    }
    pieces[256] = NULL;
    lens[256] = 0;
    int32_t end = 256;
    eng_cs_vocab *v = NULL;
    sw_error err;
    if (eng_cs_vocab_create_from_pieces(pieces, lens, 257, &end, 1, &v, &err) != SW_OK)
        fail_msg("byte vocabulary: %s", err.message);
    return v;
}

int32_t tu_argmax(const float *v, int32_t n)
{
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (v[i] > v[best])
            best = i;
    return best;
}
