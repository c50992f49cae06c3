/* units.c - see units.h. */
#include "common/units.h"

#include "common/error.h"

#include <stdio.h>
#include <strings.h>

int sw_parse_bytes(const char *text, uint64_t *out)
{
    static const struct {
        const char *suffix;
        uint64_t factor;
    } units[] = {
        {"", 1},
        {"b", 1},
        {"k", 1ULL << 10},
        {"kib", 1ULL << 10},
        {"kb", 1000ULL},
        {"m", 1ULL << 20},
        {"mib", 1ULL << 20},
        {"mb", 1000000ULL},
        {"g", 1ULL << 30},
        {"gib", 1ULL << 30},
        {"gb", 1000000000ULL},
        {"t", 1ULL << 40},
        {"tib", 1ULL << 40},
        {"tb", 1000000000000ULL},
    };
    uint64_t value = 0;
    const char *p = text;

    if (!text || *p < '0' || *p > '9')
        return SW_EINVAL;
    /* Own digit loop rather than strtoull: it accepts signs and spaces. */
    for (; *p >= '0' && *p <= '9'; p++) {
        if (__builtin_mul_overflow(value, 10, &value) ||
            __builtin_add_overflow(value, (uint64_t)(*p - '0'), &value))
            return SW_ERANGE;
    }
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcasecmp(p, units[i].suffix) == 0) {
            uint64_t bytes;
            if (__builtin_mul_overflow(value, units[i].factor, &bytes))
                return SW_ERANGE;
            *out = bytes;
            return SW_OK;
        }
    }
    return SW_EINVAL;
}

char *sw_format_bytes(uint64_t bytes, char *buf, size_t cap)
{
    static const char *names[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    int unit = 0;
    double value = (double)bytes;

    if (!buf || cap == 0)
        return buf;
    if (bytes < 1024) {
        snprintf(buf, cap, "%u B", (unsigned)bytes);
        return buf;
    }
    while (value >= 1024.0 && unit < 6) {
        value /= 1024.0;
        unit++;
    }
    /* 1023.96 KiB would print as "1024.0 KiB"; say "1.0 MiB" instead. */
    if (value >= 1023.95 && unit < 6) {
        value /= 1024.0;
        unit++;
    }
    snprintf(buf, cap, "%.1f %s", value, names[unit]);
    return buf;
}
