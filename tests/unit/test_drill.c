/* test_drill.c - `spillway drill --quick` end to end on sim-gpu, and a
 * quick `spillway bench profiles`.
 *
 * The drill itself starts real routers and workers and breaks them on
 * purpose; this test checks what a user relies on: the exit status, every
 * seed verdict in report.json, that report.md and timeline.svg exist, that
 * the SVG renders with a real renderer (rsvg-convert, installed by
 * scripts/install-deps.sh) into a non-empty PNG, and that the picture's
 * elements carry the data (one bar per request of report.json, with the
 * right worker). Also: Ctrl-C stops the drill and leaves no process and no
 * sim-gpu pool behind. scripts/drill-selfcheck.sh shows that each
 * scenario can fail.
 */
#include "testutil.h"

#include "common/alloc.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char g_model[512];

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *f)
{
    (void)st;
    (void)flag;
    (void)f;
    remove(path);
    return 0;
}

static int setup(void **state)
{
    (void)state;
    if (!tu_spillway_bin())
        return -1;
    snprintf(g_model, sizeof g_model, "%s", tu_tmp_path("drill-model.gguf"));
    char *out = NULL;
    int st = -1;
    char *argv[] = {(char *)tu_spillway_bin(), "model", "make", "-o", g_model, "--vocab", "1024",
                    "--seed", "5", NULL};
    if (tu_run_capture(argv, 60, &out, &st) != 0)
        return -1;
    sw_free(out);
    return st == 0 ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    remove(g_model);
    return 0;
}

static bool exists_nonempty(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && sb.st_size > 0;
}

/* Any process whose command line mentions text (a leftover router or
 * worker of this run: their paths contain the out directory). */
static int processes_mentioning(const char *text)
{
    DIR *d = opendir("/proc");
    int n = 0;
    if (!d)
        return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 0 || pid == getpid())
            continue;
        char path[64], buf[4096];
        snprintf(path, sizeof path, "/proc/%ld/cmdline", pid);
        int fd = open(path, O_RDONLY);
        if (fd < 0)
            continue;
        ssize_t len = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (len <= 0)
            continue;
        for (ssize_t i = 0; i < len; i++)
            if (!buf[i])
                buf[i] = ' ';
        buf[len] = '\0';
        if (strstr(buf, text)) {
            /* a zombie not yet reaped by init is not running */
            char stat_path[64], st[256] = "";
            snprintf(stat_path, sizeof stat_path, "/proc/%ld/stat", pid);
            FILE *f = fopen(stat_path, "r");
            if (f) {
                if (!fgets(st, sizeof st, f))
                    st[0] = '\0';
                fclose(f);
            }
            const char *paren = strrchr(st, ')');
            if (!paren || paren[2] != 'Z')
                n++;
        }
    }
    closedir(d);
    return n;
}

/* The sim-gpu pool of the run (named in report.json) is gone. */
static void assert_no_pool(const char *gpu_device)
{
    if (strncmp(gpu_device, "sim-gpu:", 8))
        return;
    char path[256];
    snprintf(path, sizeof path, "/dev/shm/spillway-sim-%s", gpu_device + 8);
    if (access(path, F_OK) == 0)
        fail_msg("the drill left its sim-gpu pool %s behind", path);
}

/* No sanitizer report in any router log of the run (the ASan build). */
static void assert_clean_logs(const char *out_dir)
{
    char run[600];
    snprintf(run, sizeof run, "%s/run", out_dir);
    DIR *d = opendir(run);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char log[900];
        snprintf(log, sizeof log, "%s/%s/router.log", run, e->d_name);
        char *text = tu_read_file(log, NULL);
        if (!text)
            continue;
        if (strstr(text, "Sanitizer") || strstr(text, "runtime error"))
            fail_msg("sanitizer report in %s", log);
        sw_free(text);
    }
    closedir(d);
}

/* Reads the attribute name="..." of the element starting at p (up to '>'). */
static bool attr(const char *p, const char *name, char *out, size_t cap)
{
    const char *end = strchr(p, '>');
    char key[64];
    snprintf(key, sizeof key, " %s=\"", name);
    const char *a = strstr(p, key);
    if (!a || (end && a > end))
        return false;
    a += strlen(key);
    const char *q = strchr(a, '"');
    if (!q || (size_t)(q - a) >= cap)
        return false;
    memcpy(out, a, (size_t)(q - a));
    out[q - a] = '\0';
    return true;
}

/* The elements of the SVG carry the data of report.json: one request bar
 * per request id, with its final worker; failure markers where the report
 * has a first error. Parsed from the text, independently of the writer. */
static void check_svg_data(const char *svg, json_t *report)
{
    json_t *reqs = json_object_get(report, "requests");
    assert_true(json_array_size(reqs) > 0);
    int bars = 0;
    for (const char *p = svg; (p = strstr(p, "<g class=\"request\"")); p++)
        bars++;
    assert_int_equal(bars, (int)json_array_size(reqs));
    for (size_t i = 0; i < json_array_size(reqs); i++) {
        json_t *r = json_array_get(reqs, i);
        const char *id = json_string_value(json_object_get(r, "id"));
        const char *worker = json_string_value(json_object_get(r, "final_worker"));
        assert_non_null(id);
        if (!worker || !*worker)
            worker = "none";
        int found = 0;
        for (const char *p = svg; (p = strstr(p, "<g class=\"request\"")); p++) {
            char rid[128], w[64];
            if (!attr(p, "data-request-id", rid, sizeof rid) || strcmp(rid, id))
                continue;
            found++;
            assert_true(attr(p, "data-worker", w, sizeof w));
            if (strcmp(w, worker))
                fail_msg("bar %s: data-worker '%s', report.json says '%s'", id, w, worker);
        }
        if (found != 1)
            fail_msg("request %s has %d bars in the SVG", id, found);
        /* a first error in the report is marked on the bar */
        if (json_is_object(json_object_get(r, "first_error"))) {
            char key[200];
            snprintf(key, sizeof key, "data-request-id=\"%s\" data-event=\"failure\"", id);
            if (!strstr(svg, key))
                fail_msg("request %s: no failure marker in the SVG", id);
        }
    }
    assert_non_null(strstr(svg, "class=\"legend\""));
}

/* A real PNG: the signature, an IHDR with a non-zero size, more than a
 * header's worth of data. */
static void check_png(const char *path)
{
    size_t len = 0;
    unsigned char *png = (unsigned char *)tu_read_file(path, &len);
    assert_non_null(png);
    assert_true(len > 1000);
    static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    assert_memory_equal(png, sig, 8);
    assert_memory_equal(png + 12, "IHDR", 4);
    unsigned w = (unsigned)png[16] << 24 | (unsigned)png[17] << 16 | (unsigned)png[18] << 8 | png[19];
    unsigned h = (unsigned)png[20] << 24 | (unsigned)png[21] << 16 | (unsigned)png[22] << 8 | png[23];
    assert_true(w >= 100 && h >= 100);
    sw_free(png);
}

static const char *find_rsvg(void)
{
    static const char *const paths[] = {"/usr/bin/rsvg-convert", "/usr/local/bin/rsvg-convert"};
    for (int i = 0; i < 2; i++)
        if (access(paths[i], X_OK) == 0)
            return paths[i];
    return NULL;
}

static void test_drill_quick(void **state)
{
    (void)state;
    char out_dir[512];
    snprintf(out_dir, sizeof out_dir, "%s", tu_tmp_path("drill-quick"));
    nftw(out_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    char *out = NULL;
    int st = -1;
    char *argv[] = {(char *)tu_spillway_bin(), "drill", "--quick", "--model", g_model, "--out",
                    out_dir, NULL};
    assert_int_equal(tu_run_capture(argv, 500, &out, &st), 0);
    sw_free(out);
    char path[700];
    snprintf(path, sizeof path, "%s/report.json", out_dir);
    json_error_t jerr;
    json_t *report = json_load_file(path, 0, &jerr);
    if (!report)
        fail_msg("report.json: %s (drill exit status %d)", jerr.text, st);
    if (st != 0) {
        char *md = NULL;
        snprintf(path, sizeof path, "%s/report.md", out_dir);
        md = tu_read_file(path, NULL);
        fail_msg("spillway drill exited with %d; report:\n%s", st, md ? md : "(none)");
    }
    assert_true(json_is_true(json_object_get(report, "passed")));
    /* every seed verdict passed, every scenario ran and passed */
    json_t *scen = json_object_get(report, "scenarios");
    json_t *verdicts = json_object_get(report, "verdicts");
    assert_int_equal((int)json_array_size(verdicts), 4);
    for (size_t i = 0; i < json_array_size(verdicts); i++) {
        json_t *v = json_array_get(verdicts, i);
        const char *name = json_string_value(json_object_get(v, "name"));
        const char *status = json_string_value(json_object_get(v, "status"));
        assert_non_null(name);
        assert_non_null(status);
        if (strcmp(status, "passed"))
            fail_msg("verdict %s: %s", name, status);
    }
    assert_int_equal((int)json_array_size(scen), 6);
    for (size_t i = 0; i < json_array_size(scen); i++) {
        json_t *s = json_array_get(scen, i);
        const char *status = json_string_value(json_object_get(s, "status"));
        if (strcmp(status, "passed"))
            fail_msg("scenario %s: %s (%s)", json_string_value(json_object_get(s, "id")), status,
                     json_string_value(json_object_get(s, "note")) ?: "");
    }
    /* every request has the fields a person reads */
    json_t *reqs = json_object_get(report, "requests");
    for (size_t i = 0; i < json_array_size(reqs); i++) {
        json_t *r = json_array_get(reqs, i);
        static const char *const fields[] = {"id", "first_error", "retry_decision", "cpu_start_time",
                                             "final_output", "client_connection_open", "attempts",
                                             "request_id_preserved"};
        for (int k = 0; k < 8; k++)
            if (!json_object_get(r, fields[k]))
                fail_msg("request %zu has no '%s'", i, fields[k]);
    }
    snprintf(path, sizeof path, "%s/report.md", out_dir);
    assert_true(exists_nonempty(path));
    char *md = tu_read_file(path, NULL);
    assert_non_null(md);
    assert_non_null(strstr(md, "## Verdicts"));
    assert_non_null(strstr(md, "retry_completed_once"));
    sw_free(md);
    snprintf(path, sizeof path, "%s/timeline.svg", out_dir);
    assert_true(exists_nonempty(path));
    char *svg = tu_read_file(path, NULL);
    assert_non_null(svg);
    check_svg_data(svg, report);
    sw_free(svg);
    /* nothing left running, no pool left */
    assert_int_equal(processes_mentioning(out_dir), 0);
    assert_no_pool(json_string_value(json_object_get(json_object_get(report, "setup"), "gpu_device")));
    assert_clean_logs(out_dir);

    /* the SVG renders with a real renderer */
    const char *rsvg = find_rsvg();
    if (!rsvg) {
        printf("SKIP: rsvg-convert not installed (scripts/install-deps.sh installs it); "
               "the render check did not run\n");
    } else {
        char png[700];
        snprintf(png, sizeof png, "%s/timeline.png", out_dir);
        remove(png);
        char *rargv[] = {(char *)rsvg, "-o", png, path, NULL};
        char *rout = NULL;
        int rst = -1;
        assert_int_equal(tu_run_capture(rargv, 60, &rout, &rst), 0);
        sw_free(rout);
        assert_int_equal(rst, 0);
        check_png(png);
    }
    json_decref(report);
    nftw(out_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* Ctrl-C in the middle: exit status 130, nothing left behind. */
static void test_drill_interrupted(void **state)
{
    (void)state;
    char out_dir[512], log[600];
    snprintf(out_dir, sizeof out_dir, "%s", tu_tmp_path("drill-sigint"));
    nftw(out_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    mkdir(out_dir, 0755);
    snprintf(log, sizeof log, "%s/drill.log", out_dir);
    /* a previous run's leftovers: an old router log naming a dead router,
     * and an old state directory; the drill must not be fooled by them */
    char stale[700];
    snprintf(stale, sizeof stale, "%s/run", out_dir);
    mkdir(stale, 0755);
    snprintf(stale, sizeof stale, "%s/run/s1-reserve", out_dir);
    mkdir(stale, 0755);
    snprintf(stale, sizeof stale, "%s/run/s1-reserve/router.log", out_dir);
    FILE *sf = fopen(stale, "w");
    assert_non_null(sf);
    fputs("spillway serve: listening on 127.0.0.1:1\n", sf);
    fclose(sf);
    pid_t parent = getpid();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execl(tu_spillway_bin(), "spillway", "drill", "--quick", "--model", g_model, "--out",
              out_dir, (char *)NULL);
        _exit(127);
    }
    /* wait until the drill works with its first router (its progress
     * line says so) */
    time_t t0 = time(NULL);
    for (;;) {
        char *text = tu_read_file(log, NULL);
        bool up = text && strstr(text, "[s1] reserve:");
        sw_free(text);
        if (up)
            break;
        if (time(NULL) - t0 > 60) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            fail_msg("the drill's first router did not start (log %s)", log);
        }
        usleep(20 * 1000);
    }
    usleep(200 * 1000);
    assert_int_equal(kill(pid, SIGINT), 0);
    int st = 0;
    t0 = time(NULL);
    while (waitpid(pid, &st, WNOHANG) != pid) {
        if (time(NULL) - t0 > 60) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            fail_msg("the drill did not stop within 60 s of SIGINT");
        }
        usleep(20 * 1000);
    }
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 130);
    /* give init a moment to reap orphans, then nothing may be left */
    usleep(300 * 1000);
    assert_int_equal(processes_mentioning(out_dir), 0);
    char path[700];
    snprintf(path, sizeof path, "%s/report.json", out_dir);
    json_t *report = json_load_file(path, 0, NULL);
    assert_non_null(report);
    assert_true(json_is_true(json_object_get(report, "interrupted")));
    assert_no_pool(json_string_value(json_object_get(json_object_get(report, "setup"), "gpu_device")));
    json_decref(report);
    nftw(out_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* bench profiles: every figure present and positive, the device memory
 * follows the placement (full > split > cpu = 0), the chart has a bar per
 * profile and metric. */
static void test_bench_profiles(void **state)
{
    (void)state;
    char out_dir[512];
    snprintf(out_dir, sizeof out_dir, "%s", tu_tmp_path("bench-profiles"));
    nftw(out_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    char *out = NULL;
    int st = -1;
    char *argv[] = {(char *)tu_spillway_bin(), "bench", "profiles", "--model", g_model,
                    "--gpu-layers", "1", "--gen", "6", "--out", out_dir, NULL};
    assert_int_equal(tu_run_capture(argv, 300, &out, &st), 0);
    assert_int_equal(st, 0);
    /* the table names every profile */
    assert_non_null(strstr(out, "full-gpu"));
    assert_non_null(strstr(out, "split"));
    assert_non_null(strstr(out, "cpu"));
    sw_free(out);
    char path[700];
    snprintf(path, sizeof path, "%s/profiles.json", out_dir);
    json_t *j = json_load_file(path, 0, NULL);
    assert_non_null(j);
    json_t *ps = json_object_get(j, "profiles");
    assert_int_equal((int)json_array_size(ps), 3);
    long long dev[3];
    static const char *const names[3] = {"full-gpu", "split", "cpu"};
    for (size_t i = 0; i < 3; i++) {
        json_t *p = json_array_get(ps, i);
        assert_string_equal(json_string_value(json_object_get(p, "profile")), names[i]);
        assert_true(json_is_true(json_object_get(p, "ok")));
        static const char *const positive[] = {"ttft_ms", "prefill_tokens_per_second",
                                               "decode_tokens_per_second",
                                               "client_decode_tokens_per_second",
                                               "host_rss_bytes", "host_peak_rss_bytes",
                                               "kv_bytes_per_token"};
        for (int k = 0; k < 7; k++) {
            json_t *v = json_object_get(p, positive[k]);
            if (!json_is_number(v) || json_number_value(v) <= 0)
                fail_msg("%s: %s missing or not positive", names[i], positive[k]);
        }
        dev[i] = json_integer_value(json_object_get(p, "device_memory_bytes"));
        assert_int_equal((int)json_array_size(json_object_get(p, "per_prompt")), 3);
    }
    assert_int_equal(json_integer_value(json_object_get(json_array_get(ps, 1), "device_layers")), 1);
    assert_true(dev[0] > dev[1]);
    assert_true(dev[1] > 0);
    assert_int_equal(dev[2], 0);
    json_decref(j);
    snprintf(path, sizeof path, "%s/profiles.svg", out_dir);
    char *svg = tu_read_file(path, NULL);
    assert_non_null(svg);
    int bars = 0;
    for (const char *p = svg; (p = strstr(p, "<rect class=\"bar\"")); p++)
        bars++;
    assert_int_equal(bars, 12);
    sw_free(svg);
    nftw(out_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_drill_quick),
        cmocka_unit_test(test_drill_interrupted),
        cmocka_unit_test(test_bench_profiles),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
