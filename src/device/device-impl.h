/* device-impl.h - what a device backend provides, behind device.h.
 *
 * device.c parses the spec, finds the backend in its one registration table,
 * and does what every backend shares (fault injection, argument checks, the
 * per-handle byte count for logs); a backend only manages its memory. A new
 * backend (cuda) adds a dev_backend and one line in that table, under
 * #ifdef SPILLWAY_CUDA. Included only by src/device files.
 */
#ifndef SPILLWAY_DEVICE_DEVICE_IMPL_H
#define SPILLWAY_DEVICE_DEVICE_IMPL_H

#include "device/device.h"

#include <stdatomic.h>
#include <sys/types.h>

#define DEV_SPEC_MAX 64
#define DEV_ALIGNMENT 64

typedef struct dev_backend {
    dev_kind kind;
    const char *name;   /* "cpu", "sim-gpu": the spec up to ':' */
    bool takes_argument; /* "sim-gpu:NAME", "cuda:N"; "cpu" takes none */
    bool simulated;
    /* Fills dev->impl. `argument` is the text after ':' (already checked to
     * be non-empty when takes_argument), or "" for "cpu". */
    int (*open)(dev_device *dev, const char *argument, const dev_options *opts, sw_error *err);
    void (*close)(dev_device *dev);
    /* Called after fault injection passed; bytes may be 0. Must either
     * return SW_OK with *out set or fail without holding anything. */
    int (*alloc)(dev_device *dev, size_t bytes, void **out, sw_error *err);
    void (*free)(dev_device *dev, void *ptr, size_t bytes);
    int (*memory_info)(dev_device *dev, dev_memory *out, sw_error *err);
    int (*upload)(dev_device *dev, void *dst, const void *src, size_t bytes, sw_error *err);
} dev_backend;

struct dev_device {
    const dev_backend *backend;
    char spec[DEV_SPEC_MAX];
    /* The process that opened the handle: a child that inherits it by fork
     * must open its own (its allocations would be counted as the parent's). */
    pid_t owner_pid;
    atomic_uint_least64_t self_bytes; /* live bytes allocated through this handle */
    void *impl;                       /* the backend's state */
};

extern const dev_backend dev__cpu_backend;
extern const dev_backend dev__sim_gpu_backend;
#ifdef SPILLWAY_CUDA
extern const dev_backend dev__cuda_backend;
#endif

/* Bytes as "N bytes (H)", e.g. "1048576 bytes (1.0 MiB)", for messages. */
#define DEV_BYTES_STR_MAX 48
char *dev__bytes_str(uint64_t bytes, char *buf, size_t cap);

#endif
