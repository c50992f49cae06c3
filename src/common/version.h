/* version.h - spillway's version, one place for the binary's `version`
 * and what the answers carry (system_fingerprint). */
#ifndef SPILLWAY_COMMON_VERSION_H
#define SPILLWAY_COMMON_VERSION_H

#define SPILLWAY_VERSION "0.1.0"

#endif
