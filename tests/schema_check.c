/* schema_check.c - see schema_check.h. */
#include "schema_check.h"

#include "testutil.h"

#include "common/alloc.h"

#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef SPILLWAY_SOURCE_DIR
#error "SPILLWAY_SOURCE_DIR must name the source tree (tests/jsonschema_check.py)"
#endif

json_t *sc_record(const char *file, const char *group, json_t *schema)
{
    json_t *r = json_pack("{s:s,s:s,s:O,s:[]}", "file", file, "group", group, "schema", schema,
                          "outputs");
    assert_non_null(r);
    return r;
}

json_t *sc_outputs(json_t *record)
{
    return json_object_get(record, "outputs");
}

/* Every python3 that can import jsonschema, one per distinct jsonschema
 * installation: Debian's /usr/bin/python3 first, then PATH's. Returns how
 * many (at most max) were put in found[]. */
static int find_pythons(char found[][1024], char where[][1024], int max)
{
    const char *path = getenv("PATH");
    char cand[65][1024];
    int n_cand = 0, n = 0;
    snprintf(cand[n_cand++], sizeof cand[0], "/usr/bin/python3");
    while (path && *path && n_cand < 65) {
        const char *end = strchr(path, ':');
        size_t len = end ? (size_t)(end - path) : strlen(path);
        if (len > 0 && len + 9 < sizeof cand[0]) {
            memcpy(cand[n_cand], path, len);
            memcpy(cand[n_cand] + len, "/python3", 9);
            n_cand++;
        }
        path = end ? end + 1 : NULL;
    }
    for (int i = 0; i < n_cand && n < max; i++) {
        if (access(cand[i], X_OK) != 0)
            continue;
        char *out = NULL;
        int status = -1;
        char *const probe[] = {cand[i], "-c", "import jsonschema; print(jsonschema.__file__)",
                               NULL};
        if (tu_run_capture(probe, 60, &out, &status) == 0 && status == 0 && out) {
            bool seen = false;
            for (int j = 0; j < n; j++)
                seen = seen || strncmp(where[j], out, 1000) == 0;
            if (!seen) {
                snprintf(found[n], sizeof found[0], "%.1000s", cand[i]);
                snprintf(where[n], sizeof where[0], "%.1000s", out);
                n++;
            }
        }
        sw_free(out);
    }
    return n;
}

int sc_check(const json_t *records, const char *tag)
{
    char pythons[4][1024], where[4][1024];
    int n_py = find_pythons(pythons, where, 4);
    if (n_py == 0) {
        print_message("independent check skipped: no python3 with jsonschema (Debian "
                      "python3-jsonschema, scripts/install-deps.sh)\n");
        return -1;
    }
    char name[128];
    snprintf(name, sizeof name, "%s-outputs.jsonl", tag);
    char file[4096];
    snprintf(file, sizeof file, "%s", tu_tmp_path(name));
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    for (size_t i = 0; i < json_array_size(records); i++) {
        char *line = json_dumps(json_array_get(records, i), JSON_COMPACT | JSON_ENSURE_ASCII);
        assert_non_null(line);
        fprintf(f, "%s\n", line);
        free(line);
    }
    fclose(f);
    int result = 0;
    for (int i = 0; i < n_py; i++) {
        char *const argv[] = {pythons[i], SPILLWAY_SOURCE_DIR "/tests/jsonschema_check.py", file,
                              NULL};
        char *out = NULL;
        int status = -1;
        int rc = tu_run_capture(argv, 600, &out, &status);
        /* print_message formats into a fixed buffer: the report can be longer */
        printf("independent check with %s\n%s", pythons[i], out ? out : "");
        fflush(stdout);
        sw_free(out);
        if (rc != 0 || status != 0)
            result = 1;
    }
    unlink(file);
    return result;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The names of the .json files in dir, sorted (each strdup'd), at most
 * cap. */
static size_t json_files(const char *dir, char **names, size_t cap)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < cap) {
        size_t l = strlen(e->d_name);
        if (l > 5 && strcmp(e->d_name + l - 5, ".json") == 0)
            names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, cmp_names);
    return n;
}

/* Every .json file of dir (NULL: absent, already said) parsed with
 * flags, as {name_key: NAME, value_key: DOCUMENT}, sorted by name. */
static json_t *load_dir(const char *dir, size_t flags, const char *name_key,
                        const char *value_key)
{
    if (!dir)
        return NULL;
    char dirpath[4096];
    snprintf(dirpath, sizeof dirpath, "%s", dir);
    char *names[256];
    size_t n = json_files(dirpath, names, 256);
    json_t *all = json_array();
    for (size_t i = 0; i < n; i++) {
        char path[4352];
        snprintf(path, sizeof path, "%s/%s", dirpath, names[i]);
        json_error_t jerr;
        json_t *doc = json_load_file(path, flags, &jerr);
        if (!doc)
            fail_msg("%s: %s (line %d)", path, jerr.text, jerr.line);
        json_array_append_new(all, json_pack("{s:s,s:o}", name_key, names[i], value_key, doc));
        free(names[i]);
    }
    return all;
}

json_t *sc_fixtures_load(void)
{
    return load_dir(tu_data_path("schemas"), JSON_DECODE_ANY, "file", "schema");
}

json_t *sc_suite_load(const char *draft)
{
    char rel[256];
    snprintf(rel, sizeof rel, "jsonschema-test-suite/tests/%s", draft);
    return load_dir(tu_shared_path(rel), JSON_ALLOW_NUL, "name", "groups");
}
