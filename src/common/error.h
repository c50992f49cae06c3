/* error.h - the one status enum of spillway, with its message table.
 *
 * 0 is success, every error is negative. The enum and sw_strerror() are both
 * generated from SW_ERROR_MAP so they cannot drift apart. Functions that can
 * say more than the code (which key of a file is broken, how many bytes did
 * not fit) also take an optional sw_error * that receives a message.
 */
#ifndef SPILLWAY_COMMON_ERROR_H
#define SPILLWAY_COMMON_ERROR_H

#include <stddef.h>

#define SW_ERROR_MAP(X)                                                        \
    X(OK, 0, "success")                                                        \
    X(ENOMEM, -1, "out of host memory")                                        \
    X(EIO, -2, "input/output error")                                           \
    X(EINVAL, -3, "invalid argument")                                          \
    X(EFORMAT, -4, "malformed file")                                           \
    X(EUNSUPPORTED, -5, "not supported")                                       \
    X(ERANGE, -6, "value out of range")                                        \
    X(ENOTFOUND, -7, "not found")                                              \
    X(EDEVOOM, -8, "device out of memory")                                     \
    X(ECONTEXT, -9, "context length exceeded")                                 \
    X(ECANCELLED, -10, "cancelled")                                            \
    X(ETIMEOUT, -11, "timed out")                                              \
    X(EDEVICE, -12, "device failure")                                          \
    X(EINTERNAL, -13, "internal error")                                        \
    X(ECONFLICT, -14, "claimed by another owner")                              \
    X(EUNAVAILABLE, -15, "unavailable")

typedef enum sw_status {
#define SW__ENUM(name, value, message) SW_##name = (value),
    SW_ERROR_MAP(SW__ENUM)
#undef SW__ENUM
} sw_status;

/* Static message for a status; never NULL (unknown codes get a generic one). */
const char *sw_strerror(int status);

/* Stable lower-case name of a status, e.g. "EFORMAT" -> "format". */
const char *sw_status_name(int status);

#define SW_ERROR_MESSAGE_MAX 320

/* A status with a human message. Callers may pass NULL when they only need
 * the code. */
typedef struct sw_error {
    int code;
    char message[SW_ERROR_MESSAGE_MAX];
} sw_error;

/* Records code and a printf-style message in *err (if err is not NULL) and
 * returns code, so a failing path can `return sw_error_set(err, ...)`. */
int sw_error_set(sw_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Clears *err to SW_OK with an empty message. */
void sw_error_clear(sw_error *err);

#endif
