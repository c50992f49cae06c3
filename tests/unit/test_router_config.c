/* test_router_config.c - the router's INI configuration: defaults, every
 * section, worker order, and errors that name the line and the key. */
#include "testutil.h"

#include "router/router.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const char *write_ini(const char *name, const char *text)
{
    static char path[512];
    char file[128];
    snprintf(file, sizeof file, "router-cfg-%d-%s.ini", (int)getpid(), name);
    snprintf(path, sizeof path, "%s", tu_tmp_path(file));
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

static void test_full(void **state)
{
    rt_config c;
    sw_error err;
    rt_config_defaults(&c);
    assert_string_equal(c.listen, "127.0.0.1:8080");
    assert_int_equal(c.stop_delay_ms, 0);
    assert_string_equal(c.cors_origins, "*");
    const char *p = write_ini("full", "[server]\n"
                                      "listen = 0.0.0.0:9000\n"
                                      "cors-origins = https://a.example, http://b.example:3000\n"
                                      "api-keys = key-one-123, key-two-456\n"
                                      "state-dir = /tmp/x\n"
                                      "max-body = 64KiB\n"
                                      "max-attempts = 2\n"
                                      "queue-size = 5\nqueue-timeout-ms = 250\n"
                                      "hang-timeout-ms = 700\nhealth-interval-ms = 100\n"
                                      "stop-delay-ms = 2500\n"
                                      "[model]\npath = m.gguf\n"
                                      "chat-template = qwen3\nreasoning-format = none\n"
                                      "[worker gpu]\n"
                                      "device = sim-gpu:pool\nsim-capacity = 32MiB\n"
                                      "gpu-layers = 1\nctx-limit = 512\nmax-seqs = 2\n"
                                      "reserve = 0.2\npolicy = grow\nthreads = 1\n"
                                      "fault = abort_after_tokens:3\nenv = FOO=bar\n"
                                      "preference = 5\n"
                                      "[worker cpu]\ndevice = cpu\npreference = 1\n"
                                      "[worker ext]\nurl = http://127.0.0.1:9100\n");
    assert_int_equal(rt_config_load(&c, p, &err), 0);
    assert_int_equal(rt_config_check(&c, &err), 0);
    assert_string_equal(c.listen, "0.0.0.0:9000");
    assert_string_equal(c.cors_origins, "https://a.example, http://b.example:3000");
    assert_int_equal(c.n_keys, 2);
    assert_string_equal(c.api_keys[1], "key-two-456");
    assert_int_equal((int)c.max_body_bytes, 65536);
    assert_int_equal(c.max_attempts, 2);
    assert_int_equal(c.queue_size, 5);
    assert_int_equal(c.queue_timeout_ms, 250);
    assert_int_equal(c.hang_timeout_ms, 700);
    assert_int_equal(c.health_interval_ms, 100);
    assert_int_equal(c.stop_delay_ms, 2500);
    assert_int_equal(c.n_workers, 3);
    assert_string_equal(c.models[0].chat_template, "qwen3");
    assert_string_equal(c.models[0].reasoning_format, "none");
    const rt_worker_config *g = &c.workers[0];
    assert_string_equal(g->name, "gpu");
    assert_true(g->managed);
    assert_string_equal(g->device, "sim-gpu:pool");
    assert_int_equal((int)g->sim_capacity, 32 << 20);
    assert_int_equal(g->gpu_layers, 1);
    assert_int_equal(g->ctx_limit, 512);
    assert_string_equal(g->policy, "grow");
    assert_int_equal(g->n_env, 2);
    assert_string_equal(g->env[0], "SPILLWAY_FAULT=abort_after_tokens:3");
    assert_string_equal(g->env[1], "FOO=bar");
    assert_int_equal(g->preference, 5);
    assert_string_equal(c.workers[1].device, "");
    assert_int_equal(c.workers[1].preference, 1);
    assert_false(c.workers[2].managed);
    assert_string_equal(c.workers[2].url, "http://127.0.0.1:9100");
    /* file order is the default preference */
    assert_int_equal(c.workers[2].preference, 2);
    remove(p);
}

/* The message names the file's line and the key. */
static void expect_error(const char *name, const char *text, int line, const char *key)
{
    rt_config c;
    sw_error err;
    rt_config_defaults(&c);
    const char *p = write_ini(name, text);
    assert_int_equal(rt_config_load(&c, p, &err), SW_EINVAL);
    char want[32];
    snprintf(want, sizeof want, ":%d: ", line);
    if (!strstr(err.message, want) || !strstr(err.message, key))
        fail_msg("message '%s' lacks line %d or key %s", err.message, line, key);
    remove(p);
}

static void test_errors(void **state)
{
    expect_error("unknown-key", "[server]\nlisten = 127.0.0.1:1\nbogus = 1\n", 3, "bogus");
    expect_error("bad-value", "[model]\npath = m\n[worker a]\nmax-seqs = 0\n", 4, "max-seqs");
    expect_error("bad-policy", "[worker a]\n\npolicy = fast\n", 3, "policy");
    expect_error("bad-device", "[worker a]\ndevice = tpu:0\n", 2, "device");
    expect_error("bad-size", "[worker a]\nsim-capacity = 12XB\n", 2, "sim-capacity");
    expect_error("bad-section", "[model]\npath = m\n[workers]\nx = 1\n", 4, "workers");
    expect_error("twice", "[worker a]\nthreads = 1\n[worker b]\nthreads = 1\n[worker a]\nthreads = 2\n", 6,
                 "worker a");
    expect_error("bad-url", "[worker a]\nurl = ftp://x\n", 2, "url");
    expect_error("short-key", "[server]\napi-keys = abc\n", 2, "api-keys");
    expect_error("bad-reasoning", "[model]\npath = m\nreasoning-format = parsed\n", 3,
                 "reasoning-format");
    expect_error("cors-wildcard", "[server]\ncors-origins = https://*.example\n", 2,
                 "cors-origins");
    expect_error("stop-delay", "[server]\nstop-delay-ms = -1\n", 2, "stop-delay-ms");
    expect_error("cors-path", "[server]\ncors-origins = https://a.example/app\n", 2,
                 "cors-origins");

    rt_config c;
    sw_error err;
    rt_config_defaults(&c);
    assert_int_equal(rt_config_load(&c, tu_tmp_path("router-no-such-file.ini"), &err), SW_EIO);
}

static void test_check(void **state)
{
    rt_config c;
    sw_error err;
    rt_config_defaults(&c);
    const char *p = write_ini("check", "[server]\nlisten = 0.0.0.0:8080\n[model]\npath = m\n"
                                       "[worker cpu]\nthreads = 1\n");
    assert_int_equal(rt_config_load(&c, p, &err), 0);
    /* refuses a non-loopback address without an API key */
    assert_int_equal(rt_config_check(&c, &err), SW_EINVAL);
    assert_non_null(strstr(err.message, "api-keys"));
    snprintf(c.listen, sizeof c.listen, "127.0.0.1:0");
    assert_int_equal(rt_config_check(&c, &err), 0);
    c.n_workers = 0;
    assert_int_equal(rt_config_check(&c, &err), SW_EINVAL);
    c.n_workers = 1;
    c.models[0].path[0] = 0;
    assert_int_equal(rt_config_check(&c, &err), SW_EINVAL);
    remove(p);
}

/* Loads and checks text: 0, or the error with its message in err. */
static int load_checked(const char *name, const char *text, sw_error *err)
{
    rt_config c;
    rt_config_defaults(&c);
    const char *p = write_ini(name, text);
    int rc = rt_config_load(&c, p, err);
    if (rc == 0)
        rc = rt_config_check(&c, err);
    remove(p);
    return rc;
}

/* Image keys: mmproj on a llama-server the router runs (only there),
 * [model] image-tokens, [server] max-image-bytes; and the example of a
 * llama-server pair, config/llama-server-pair.ini. */
static void test_images(void **state)
{
    (void)state;
    sw_error err;
    rt_config c;
    rt_config_defaults(&c);
    assert_int_equal(c.max_image_bytes, (size_t)20 << 20);
    const char *p = write_ini("images", "[server]\nmax-image-bytes = 4MiB\n"
                                        "[model]\npath = m\nimage-tokens = 256\n"
                                        "[worker v]\nkind = llama-server\n"
                                        "command = llama-server -m {model_path} --port {port}\n"
                                        "mmproj = /m/mmproj.gguf\n");
    assert_int_equal(rt_config_load(&c, p, &err), 0);
    assert_int_equal(rt_config_check(&c, &err), 0);
    assert_int_equal(c.max_image_bytes, (size_t)4 << 20);
    assert_int_equal(c.models[0].image_tokens, 256);
    assert_string_equal(c.workers[0].mmproj, "/m/mmproj.gguf");
    remove(p);
    /* a spillway worker, or a llama-server at a url (its /props says) */
    assert_int_equal(load_checked("mmproj-spillway",
                                  "[model]\npath = m\n[worker c]\nmmproj = /m/p.gguf\n", &err),
                     SW_EINVAL);
    assert_non_null(strstr(err.message, "mmproj"));
    assert_int_equal(load_checked("mmproj-url",
                                  "[model]\npath = m\n[worker c]\nkind = llama-server\n"
                                  "url = http://127.0.0.1:9\nmmproj = /m/p.gguf\n",
                                  &err),
                     SW_EINVAL);
    assert_non_null(strstr(err.message, "/props"));
    assert_int_equal(load_checked("image-tokens", "[model]\npath = m\nimage-tokens = -1\n"
                                                  "[worker c]\nthreads = 1\n", &err),
                     SW_EINVAL);
    assert_int_equal(load_checked("image-bytes", "[server]\nmax-image-bytes = 1\n"
                                                 "[model]\npath = m\n[worker c]\nthreads = 1\n",
                                  &err),
                     SW_EINVAL);
    /* the example: two llama-servers, -ngl 99 then -ngl 0, the same file */
    char path[600];
    snprintf(path, sizeof path, "%s/config/llama-server-pair.ini", SPILLWAY_SOURCE_DIR);
    rt_config_defaults(&c);
    assert_int_equal(rt_config_load(&c, path, &err), 0);
    assert_int_equal(rt_config_check(&c, &err), 0);
    assert_int_equal(c.n_workers, 2);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(c.workers[i].kind, RT_KIND_LLAMA_SERVER);
        assert_non_null(strstr(c.workers[i].command, "{model_path}"));
    }
    assert_non_null(strstr(c.workers[0].command, "-ngl 99"));
    assert_non_null(strstr(c.workers[1].command, "-ngl 0"));
}

/* https:// urls, ca-file and api-key-env (a remote tier over TLS) */
static void test_remote(void **state)
{
    sw_error err;
    rt_config c;
    rt_config_defaults(&c);
    const char *p = write_ini("remote", "[model]\npath = m\n[worker cloud]\nkind = openai\n"
                                        "url = https://api.example.com\nca-file = /etc/ca.pem\n"
                                        "api-key-env = CLOUD_KEY\n");
    assert_int_equal(rt_config_load(&c, p, &err), 0);
    assert_int_equal(rt_config_check(&c, &err), 0);
    assert_string_equal(c.workers[0].url, "https://api.example.com");
    assert_string_equal(c.workers[0].ca_file, "/etc/ca.pem");
    assert_string_equal(c.workers[0].api_key_env, "CLOUD_KEY");
    assert_false(c.workers[0].managed);
    remove(p);

    expect_error("bad-key-env", "[worker a]\nkind = openai\napi-key-env = A-B\n", 3,
                 "api-key-env");
    expect_error("digit-key-env", "[worker a]\nkind = openai\napi-key-env = 1KEY\n", 3,
                 "api-key-env");
    assert_int_equal(load_checked("https-spillway",
                                  "[model]\npath = m\n[worker a]\nurl = https://h:1\n", &err),
                     SW_EINVAL);
    assert_non_null(strstr(err.message, "https:// url is for kind = openai"));
    assert_int_equal(load_checked("https-command",
                                  "[model]\npath = m\n[worker a]\nkind = openai\n"
                                  "url = https://h:1\ncommand = engine\n",
                                  &err),
                     SW_EINVAL);
    assert_int_equal(load_checked("ca-http",
                                  "[model]\npath = m\n[worker a]\nkind = openai\n"
                                  "url = http://h:1\nca-file = /ca.pem\n",
                                  &err),
                     SW_EINVAL);
    assert_non_null(strstr(err.message, "ca-file needs an https:// url"));
    assert_int_equal(load_checked("same-url",
                                  "[model]\npath = m\n[worker a]\nkind = openai\n"
                                  "url = https://h:1\napi-key-env = K1\n"
                                  "[worker b]\nkind = openai\nurl = https://h:1\n"
                                  "api-key-env = K2\n",
                                  &err),
                     SW_EINVAL);
    assert_non_null(strstr(err.message, "also [worker a]'s"));
    expect_error("bad-remote", "[model]\npath = m\nremote = sometimes\n", 3, "remote");
    rt_config_defaults(&c);
    p = write_ini("remote-never", "[model]\npath = m\nremote = never\n[worker a]\nthreads = 1\n");
    assert_int_equal(rt_config_load(&c, p, &err), 0);
    assert_true(c.models[0].remote_never);
    remove(p);
    /* what leaves the machine */
    rt_worker_config w;
    memset(&w, 0, sizeof w);
    w.kind = RT_KIND_OPENAI;
    const struct {
        const char *url;
        bool remote;
    } urls[] = {{"https://api.example.com", true}, {"https://127.0.0.1:8443", true},
                {"http://10.0.0.5:8080", true},    {"http://gpu-box:8080/v1", true},
                {"http://127.0.0.1:8080", false},  {"http://localhost:11434", false},
                {"http://[::1]:8080", false},      {"unix:/run/engine.sock", false}};
    for (size_t i = 0; i < sizeof urls / sizeof urls[0]; i++) {
        snprintf(w.url, sizeof w.url, "%s", urls[i].url);
        if (rt_config_worker_remote(&w) != urls[i].remote)
            fail_msg("%s: remote should be %d", urls[i].url, urls[i].remote);
    }
    w.managed = true; /* an engine the router runs is local */
    snprintf(w.url, sizeof w.url, "http://10.0.0.5:8080");
    assert_false(rt_config_worker_remote(&w));
    assert_int_equal(load_checked("key-spillway",
                                  "[model]\npath = m\n[worker a]\nurl = http://h:1\n"
                                  "api-key-env = K\n",
                                  &err),
                     SW_EINVAL);
}

/* [server] ledger and ledger-lease-s; a URL with a password is refused
 * without being echoed; --ledger overrides the file. */
static void test_ledger(void **state)
{
    rt_config c;
    sw_error err;
    rt_config_defaults(&c);
    assert_string_equal(c.ledger, "");
    assert_int_equal(c.ledger_lease_s, 10);
    const char *p = write_ini("ledger", "[server]\nledger = postgresql://spill@127.0.0.1:5432/db\n"
                                        "ledger-lease-s = 3\n[model]\npath = m\n[worker a]\nthreads = 1\n");
    assert_int_equal(rt_config_load(&c, p, &err), 0);
    assert_string_equal(c.ledger, "postgresql://spill@127.0.0.1:5432/db");
    assert_int_equal(c.ledger_lease_s, 3);
    if (rt_config_read(&c, p, NULL, NULL, NULL, "postgres://other@h/d", &err))
        fail_msg("%s", err.message);
    assert_string_equal(c.ledger, "postgres://other@h/d");
    assert_string_equal(c.override_ledger, "postgres://other@h/d");
    assert_int_equal(rt_config_read(&c, p, NULL, NULL, NULL, "postgres://u:pw@h/d", &err),
                     SW_EINVAL);
    assert_non_null(strstr(err.message, "PGPASSWORD"));
    assert_null(strstr(err.message, "pw@"));
    remove(p);
    expect_error("ledger-password", "[server]\nledger = postgresql://u:hunter2@h:1/d\n", 2, "ledger");
    assert_int_equal(load_checked("ledger-pw", "[server]\nledger = postgresql://u:hunter2@h/d\n"
                                               "[model]\npath = m\n[worker a]\nthreads = 1\n", &err),
                     SW_EINVAL);
    assert_null(strstr(err.message, "hunter2"));
    assert_non_null(strstr(err.message, ".pgpass"));
    expect_error("ledger-query-pw", "[server]\nledger = postgresql://u@h/d?password=x\n", 2,
                 "ledger");
    expect_error("ledger-scheme", "[server]\nledger = mysql://u@h/d\n", 2, "ledger");
    expect_error("ledger-lease", "[server]\nledger-lease-s = 0\n", 2, "ledger-lease-s");
    /* empty: SQLite in state-dir */
    assert_int_equal(load_checked("ledger-empty", "[server]\nledger =\n[model]\npath = m\n"
                                                  "[worker a]\nthreads = 1\n", &err), 0);
    /* an @ in the path is not a user part */
    char why[200];
    assert_true(rt_config_ledger_valid("postgresql://u@h:5/d@x:y", why, sizeof why));
    assert_true(rt_config_ledger_valid("postgresql:///db?host=/tmp/s", why, sizeof why));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_check),
        cmocka_unit_test(test_remote),
        cmocka_unit_test(test_images),
        cmocka_unit_test(test_ledger),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
