/* log.h - leveled logging to stderr, as text or as JSON lines.
 *
 * The level and format come from the environment at first use
 * (SPILLWAY_LOG=debug|info|warn|error, SPILLWAY_LOG_JSON=1) and can be set by
 * the CLI. Each line carries a module name; a request id can be attached
 * later by callers through the message itself.
 */
#ifndef SPILLWAY_COMMON_LOG_H
#define SPILLWAY_COMMON_LOG_H

#include <stdbool.h>

typedef enum sw_log_level {
    SW_LOG_DEBUG = 0,
    SW_LOG_INFO = 1,
    SW_LOG_WARN = 2,
    SW_LOG_ERROR = 3,
    SW_LOG_OFF = 4,
} sw_log_level;

void sw_log_set_level(sw_log_level level);
void sw_log_set_json(bool json);
sw_log_level sw_log_get_level(void);
/* Parses "debug", "info", "warn", "error", "off"; returns -1 if unknown. */
int sw_log_parse_level(const char *name);

void sw_log(sw_log_level level, const char *module, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define SW_DEBUG(module, ...) sw_log(SW_LOG_DEBUG, module, __VA_ARGS__)
#define SW_INFO(module, ...) sw_log(SW_LOG_INFO, module, __VA_ARGS__)
#define SW_WARN(module, ...) sw_log(SW_LOG_WARN, module, __VA_ARGS__)
#define SW_ERROR(module, ...) sw_log(SW_LOG_ERROR, module, __VA_ARGS__)

#endif
