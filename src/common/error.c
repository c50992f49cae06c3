/* error.c - message table for sw_status and the sw_error helpers. */
#include "common/error.h"

#include <stdarg.h>
#include <stdio.h>

const char *sw_strerror(int status)
{
    switch (status) {
#define SW__CASE(name, value, message) case value: return message;
        SW_ERROR_MAP(SW__CASE)
#undef SW__CASE
    }
    return "unknown error";
}

const char *sw_status_name(int status)
{
    switch (status) {
#define SW__NAME(name, value, message) case value: return #name;
        SW_ERROR_MAP(SW__NAME)
#undef SW__NAME
    }
    return "EUNKNOWN";
}

int sw_error_set(sw_error *err, int code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        err->code = code;
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
    }
    return code;
}

void sw_error_clear(sw_error *err)
{
    if (err) {
        err->code = SW_OK;
        err->message[0] = '\0';
    }
}
