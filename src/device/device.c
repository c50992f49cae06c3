/* device.c - device handles: spec parsing, the one backend registration
 * table, what every backend shares (fault injection, the per-handle byte
 * count, argument checks), and the cpu device.
 *
 * The cpu device is system RAM: allocations are aligned host allocations
 * through the allocation hook, and its numbers come from /proc/meminfo
 * (total = MemTotal, free = MemAvailable). Linux overcommits, so a malloc
 * larger than the memory left would "succeed" and the OOM killer would
 * settle it later; a single allocation larger than MemAvailable is therefore
 * refused up front with SW_EDEVOOM. That is a check at the moment of the
 * call, not a reservation: other processes can still take the memory.
 */
#include "device/device.h"

#include "common/alloc.h"
#include "common/log.h"
#include "common/units.h"
#include "device/device-impl.h"
#include "device/fault.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* The registration table: every backend this build has. */
static const dev_backend *const dev_backends[] = {
    &dev__cpu_backend,
    &dev__sim_gpu_backend,
#ifdef SPILLWAY_CUDA
    &dev__cuda_backend,
#endif
};

char *dev__bytes_str(uint64_t bytes, char *buf, size_t cap)
{
    char human[SW_BYTES_STR_MAX];
    snprintf(buf, cap, "%" PRIu64 " bytes (%s)", bytes,
             sw_format_bytes(bytes, human, sizeof human));
    return buf;
}

const char *dev_kind_name(dev_kind kind)
{
    switch (kind) {
    case DEV_KIND_CPU: return "cpu";
    case DEV_KIND_SIM_GPU: return "sim-gpu";
    case DEV_KIND_CUDA: return "cuda";
    }
    return "unknown";
}

/* "cuda:N" is recognised in every build, so a build without CUDA can say so
 * instead of calling the spec malformed. */
static int check_cuda_argument(const char *arg, sw_error *err)
{
    size_t len = strlen(arg);
    if (len == 0 || len > 3 || strspn(arg, "0123456789") != len)
        return sw_error_set(err, SW_EINVAL,
                            "bad device 'cuda:%.16s': the GPU index must be a number, as in cuda:0",
                            arg);
    return SW_OK;
}

int dev_open(const char *spec, const dev_options *opts, dev_device **out, sw_error *err)
{
    static const dev_options no_options = {0};
    const dev_backend *backend = NULL;
    const char *argument = "";
    dev_device *dev = NULL;
    size_t name_len;
    int rc;

    if (!opts)
        opts = &no_options;
    if (!spec || !*spec)
        return sw_error_set(err, SW_EINVAL,
                            "no device given (expected cpu, sim-gpu:NAME or cuda:N)");
    if (strlen(spec) >= DEV_SPEC_MAX)
        return sw_error_set(err, SW_EINVAL, "device spec too long: '%.40s...'", spec);
    name_len = strcspn(spec, ":");
    if (spec[name_len] == ':')
        argument = spec + name_len + 1;

    if (name_len == 4 && strncmp(spec, "cuda", 4) == 0) {
        if ((rc = check_cuda_argument(argument, err)) != SW_OK)
            return rc;
#ifndef SPILLWAY_CUDA
        return sw_error_set(err, SW_EUNSUPPORTED,
                            "%s: this build has no CUDA device (build with SPILLWAY_CUDA)", spec);
#endif
    }
    for (size_t i = 0; i < sizeof dev_backends / sizeof dev_backends[0]; i++) {
        const char *name = dev_backends[i]->name;
        if (strlen(name) == name_len && strncmp(spec, name, name_len) == 0)
            backend = dev_backends[i];
    }
    if (!backend)
        return sw_error_set(err, SW_EINVAL,
                            "unknown device '%s' (expected cpu, sim-gpu:NAME or cuda:N)", spec);
    if (backend->takes_argument && !*argument)
        return sw_error_set(err, SW_EINVAL, "device '%s' needs a name after ':' (as in %s:demo)",
                            spec, backend->name);
    if (!backend->takes_argument && spec[name_len] == ':')
        return sw_error_set(err, SW_EINVAL, "device '%s' takes no argument (write %s)", spec,
                            backend->name);

    dev = sw_calloc(1, sizeof *dev);
    if (!dev)
        return sw_error_set(err, SW_ENOMEM, "out of host memory opening %s", spec);
    dev->backend = backend;
    snprintf(dev->spec, sizeof dev->spec, "%s", spec);
    dev->owner_pid = getpid();
    atomic_init(&dev->self_bytes, 0);
    if ((rc = backend->open(dev, argument, opts, err)) != SW_OK)
        goto fail;
    *out = dev;
    return SW_OK;
fail:
    sw_free(dev);
    return rc;
}

void dev_close(dev_device *dev)
{
    if (!dev)
        return;
    uint64_t left = atomic_load(&dev->self_bytes);
    if (left > 0 && dev->owner_pid == getpid()) {
        char held[DEV_BYTES_STR_MAX];
        SW_WARN("device", "%s%s closed with %s still allocated", dev->spec,
                dev->backend->simulated ? " (simulated)" : "",
                dev__bytes_str(left, held, sizeof held));
    }
    dev->backend->close(dev);
    sw_free(dev);
}

dev_kind dev_get_kind(const dev_device *dev) { return dev->backend->kind; }

const char *dev_spec(const dev_device *dev) { return dev->spec; }

bool dev_is_simulated(const dev_device *dev) { return dev->backend->simulated; }

static int check_owner(dev_device *dev, sw_error *err)
{
    if (dev->owner_pid != getpid())
        return sw_error_set(err, SW_EINVAL,
                            "%s: device handle opened by process %ld used in process %ld "
                            "(open the device again after fork)",
                            dev->spec, (long)dev->owner_pid, (long)getpid());
    return SW_OK;
}

int dev_alloc(dev_device *dev, size_t bytes, const char *purpose, void **out, sw_error *err)
{
    char asked[DEV_BYTES_STR_MAX];
    void *ptr = NULL;
    int rc;

    if (!dev || !out)
        return sw_error_set(err, SW_EINVAL, "dev_alloc: no device or output pointer");
    if ((rc = check_owner(dev, err)) != SW_OK)
        return rc;
    if (bytes > (size_t)INT64_MAX)
        return sw_error_set(err, SW_EDEVOOM, "%s out of memory: asked %s for %s", dev->spec,
                            dev__bytes_str(bytes, asked, sizeof asked),
                            purpose ? purpose : "an allocation");
    if (dev_fault_alloc_should_fail(bytes)) {
        SW_WARN("device", "%s%s: injected allocation failure (%s) for %s", dev->spec,
                dev->backend->simulated ? " (simulated)" : "",
                dev__bytes_str(bytes, asked, sizeof asked), purpose ? purpose : "an allocation");
        return sw_error_set(err, SW_EDEVOOM,
                            "%s out of memory: asked %s for %s (injected by %s)", dev->spec,
                            dev__bytes_str(bytes, asked, sizeof asked),
                            purpose ? purpose : "an allocation", DEV_FAULT_ENV);
    }
    if ((rc = dev->backend->alloc(dev, bytes, &ptr, err)) != SW_OK)
        return rc;
    atomic_fetch_add(&dev->self_bytes, (uint64_t)bytes);
    SW_DEBUG("device", "%s%s: allocated %s for %s", dev->spec,
             dev->backend->simulated ? " (simulated)" : "",
             dev__bytes_str(bytes, asked, sizeof asked), purpose ? purpose : "an allocation");
    *out = ptr;
    return SW_OK;
}

void dev_free(dev_device *dev, void *ptr, size_t bytes)
{
    if (!dev || !ptr)
        return;
    if (dev->owner_pid != getpid()) {
        /* A forked child freeing an inherited pointer: its copy of the
         * memory is its own, the pool accounting belongs to the parent.
         * (A CUDA pointer is not host memory; the child has no context.) */
        if (dev->backend->kind != DEV_KIND_CUDA)
            sw_free(ptr);
        return;
    }
    uint64_t held = atomic_load(&dev->self_bytes);
    if (bytes > held) {
        SW_ERROR("device", "%s: freeing %zu bytes but only %" PRIu64 " are allocated "
                 "(accounting clamped)", dev->spec, bytes, held);
        bytes = (size_t)held;
    }
    atomic_fetch_sub(&dev->self_bytes, (uint64_t)bytes);
    dev->backend->free(dev, ptr, bytes);
}

int dev_memory_info(dev_device *dev, dev_memory *out, sw_error *err)
{
    if (!dev || !out)
        return sw_error_set(err, SW_EINVAL, "dev_memory_info: no device or output");
    return dev->backend->memory_info(dev, out, err);
}

int dev_upload(dev_device *dev, void *dst, const void *src, size_t bytes, sw_error *err)
{
    if (!dev)
        return sw_error_set(err, SW_EINVAL, "dev_upload: no device");
    if (bytes == 0)
        return SW_OK;
    if (!dst || !src)
        return sw_error_set(err, SW_EINVAL, "%s: upload of %zu bytes with a NULL pointer",
                            dev->spec, bytes);
    return dev->backend->upload(dev, dst, src, bytes, err);
}

/* ---- cpu ------------------------------------------------------------------ */

/* MemTotal and MemAvailable in bytes. */
static int cpu_read_meminfo(uint64_t *total, uint64_t *available, sw_error *err)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kib;
    bool have_total = false, have_available = false;

    if (!f)
        return sw_error_set(err, SW_EIO, "cpu: cannot read /proc/meminfo");
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "MemTotal: %llu kB", &kib) == 1) {
            *total = (uint64_t)kib * 1024;
            have_total = true;
        } else if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
            *available = (uint64_t)kib * 1024;
            have_available = true;
        }
    }
    fclose(f);
    if (!have_total || !have_available)
        return sw_error_set(err, SW_EIO, "cpu: /proc/meminfo lacks MemTotal or MemAvailable");
    if (*available > *total)
        *available = *total;
    return SW_OK;
}

static int cpu_open(dev_device *dev, const char *argument, const dev_options *opts, sw_error *err)
{
    uint64_t total, available;
    char total_str[DEV_BYTES_STR_MAX], available_str[DEV_BYTES_STR_MAX];
    int rc = cpu_read_meminfo(&total, &available, err);
    if (rc != SW_OK)
        return rc;
    SW_DEBUG("device", "cpu: %s total, %s available", dev__bytes_str(total, total_str, sizeof
             total_str), dev__bytes_str(available, available_str, sizeof available_str));
    return SW_OK;
}

static void cpu_close(dev_device *dev) {}

static int cpu_alloc(dev_device *dev, size_t bytes, void **out, sw_error *err)
{
    uint64_t total, available;
    char asked[DEV_BYTES_STR_MAX], avail_str[DEV_BYTES_STR_MAX], total_str[DEV_BYTES_STR_MAX];
    void *ptr;
    if (cpu_read_meminfo(&total, &available, NULL) == SW_OK && bytes > available)
        return sw_error_set(err, SW_EDEVOOM, "cpu out of memory: asked %s, %s available of %s",
                            dev__bytes_str(bytes, asked, sizeof asked),
                            dev__bytes_str(available, avail_str, sizeof avail_str),
                            dev__bytes_str(total, total_str, sizeof total_str));
    ptr = sw_aligned_alloc(DEV_ALIGNMENT, bytes);
    if (!ptr)
        return sw_error_set(err, SW_EDEVOOM, "cpu out of memory: the host refused %s",
                            dev__bytes_str(bytes, asked, sizeof asked));
    *out = ptr;
    return SW_OK;
}

static void cpu_free(dev_device *dev, void *ptr, size_t bytes) { sw_free(ptr); }

static int cpu_memory_info(dev_device *dev, dev_memory *out, sw_error *err)
{
    uint64_t total, available;
    int rc = cpu_read_meminfo(&total, &available, err);
    if (rc != SW_OK)
        return rc;
    out->total_bytes = total;
    out->free_bytes = available;
    out->used_bytes = total - available;
    out->self_bytes = atomic_load(&dev->self_bytes);
    return SW_OK;
}

static int cpu_upload(dev_device *dev, void *dst, const void *src, size_t bytes, sw_error *err)
{
    memcpy(dst, src, bytes);
    return SW_OK;
}

const dev_backend dev__cpu_backend = {
    .kind = DEV_KIND_CPU,
    .name = "cpu",
    .takes_argument = false,
    .simulated = false,
    .open = cpu_open,
    .close = cpu_close,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .memory_info = cpu_memory_info,
    .upload = cpu_upload,
};
