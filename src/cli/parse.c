/* parse.c - small argument parsers shared by the subcommands. */
#include "cli/cli.h"

#include "engine/model.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

int cli_parse_bytes(const char *text, unsigned long long *out)
{
    static const struct { const char *suffix; unsigned long long factor; } units[] = {
        {"", 1}, {"b", 1}, {"k", 1024ULL}, {"kib", 1024ULL}, {"kb", 1000ULL},
        {"m", 1024ULL << 10}, {"mib", 1024ULL << 10}, {"mb", 1000000ULL},
        {"g", 1024ULL << 20}, {"gib", 1024ULL << 20}, {"gb", 1000000000ULL},
        {"t", 1024ULL << 30}, {"tib", 1024ULL << 30}, {"tb", 1000000000000ULL},
    };
    char *end;
    errno = 0;
    if (!text || !isdigit((unsigned char)*text))
        return -1;
    unsigned long long value = strtoull(text, &end, 10);
    if (errno)
        return -1;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcasecmp(end, units[i].suffix) == 0) {
            if (value > ~0ULL / units[i].factor)
                return -1;
            *out = value * units[i].factor;
            return 0;
        }
    }
    return -1;
}

int cli_parse_kv_type(const char *command, const char *text, uint32_t *out)
{
    int type = eng_kv_type_from_name(text);
    if (type < 0) {
        fprintf(stderr, "spillway %s: --kv-type is f16, q8_0, q4_0 or f32, not '%s'\n", command,
                text);
        return 2;
    }
    *out = (uint32_t)type;
    return 0;
}
