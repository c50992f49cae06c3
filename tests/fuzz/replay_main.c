/* replay_main.c - runs a fuzz harness on every file of a directory.
 *
 * Linked with each tests/fuzz/fuzz_*.c into <name>_replay, so the committed
 * corpus runs as a plain test in every build (and under ASan in the
 * sanitizer build) without libFuzzer. Each input is copied into a buffer of
 * exactly its size, so a read past the end is caught by ASan.
 */
#include "common/alloc.h"

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Reads a whole file into a new exact-size buffer (sw_free); NULL on error. */
static uint8_t *read_all(const char *path, size_t *size_out)
{
    FILE *f = fopen(path, "rb");
    uint8_t *buf = NULL;
    struct stat st;
    if (!f)
        return NULL;
    if (fstat(fileno(f), &st) != 0 || st.st_size < 0)
        goto fail;
    buf = sw_malloc((size_t)st.st_size);
    if (!buf || fread(buf, 1, (size_t)st.st_size, f) != (size_t)st.st_size)
        goto fail;
    fclose(f);
    *size_out = (size_t)st.st_size;
    return buf;
fail:
    sw_free(buf);
    fclose(f);
    return NULL;
}

int main(int argc, char **argv)
{
    DIR *dir;
    struct dirent *entry;
    int n_files = 0, n_errors = 0;
    char path[4096];

    if (argc != 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
        return 2;
    }
    dir = opendir(argv[1]);
    if (!dir) {
        fprintf(stderr, "%s: cannot open %s\n", argv[0], argv[1]);
        return 1;
    }
    while ((entry = readdir(dir)) != NULL) {
        struct stat st;
        size_t size = 0;
        if (entry->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "%s/%s", argv[1], entry->d_name);
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        uint8_t *data = read_all(path, &size);
        if (!data) {
            fprintf(stderr, "%s: cannot read %s\n", argv[0], path);
            n_errors++;
            continue;
        }
        LLVMFuzzerTestOneInput(data, size);
        sw_free(data);
        n_files++;
    }
    closedir(dir);
    printf("%s: ran %d inputs from %s\n", argv[0], n_files, argv[1]);
    /* An empty corpus means the test proved nothing. */
    return n_errors == 0 && n_files > 0 ? 0 : 1;
}
