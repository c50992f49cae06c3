/* device.h - where an engine's memory lives and its kernels run.
 *
 * Every device has the same small interface: allocate and free device
 * memory (an allocation that does not fit fails cleanly with SW_EDEVOOM,
 * never an abort), report total / used / free memory, and copy data in.
 * Backends (DESIGN.md, Devices):
 *   cpu           system RAM; total/free from the kernel's MemAvailable
 *   sim-gpu:NAME  a fixed-capacity pool shared by every process on the
 *                 machine that opens the same NAME (POSIX shared memory);
 *                 a process that dies, even by SIGKILL, gives its share
 *                 back. Memory is host memory and kernels are the CPU's,
 *                 but the capacity is really enforced. Always reported as
 *                 simulated.
 *   cuda:N        VRAM through cudaMalloc (SPILLWAY_CUDA builds).
 *
 * Pointers returned by dev_alloc on cpu and sim-gpu are host pointers the
 * CPU kernels can use directly. CUDA will return device pointers, so callers
 * copy data in with dev_upload rather than memcpy.
 *
 * Fault injection (device/fault.h) applies to every device's allocations.
 *
 * Handles: a handle belongs to the process that opened it; a child made by
 * fork() must open its own (dev_alloc on an inherited handle is SW_EINVAL,
 * dev_close there only unmaps). Calls on one handle may come from several
 * threads. On sim-gpu each handle has its own slot in the pool, so
 * self_bytes and what dev_close returns are per handle even when one process
 * opens the same pool twice.
 */
#ifndef SPILLWAY_DEVICE_DEVICE_H
#define SPILLWAY_DEVICE_DEVICE_H

#include "common/error.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum dev_kind {
    DEV_KIND_CPU = 0,
    DEV_KIND_SIM_GPU = 1,
    DEV_KIND_CUDA = 2,
} dev_kind;

typedef struct dev_options {
    /* sim-gpu: capacity of the pool when this process creates it. A process
     * that opens an existing pool adopts its capacity; a different non-zero
     * value here is an error naming both. 0 = use the existing pool's, or
     * fail if it does not exist yet. */
    uint64_t sim_capacity_bytes;
    /* sim-gpu: open an existing pool only (SW_ENOTFOUND when there is none,
     * whatever sim_capacity_bytes says), and leave it as it was at close:
     * for a look that must create nothing (`model plan`). */
    bool sim_no_create;
} dev_options;

typedef struct dev_memory {
    uint64_t total_bytes;     /* capacity of the device */
    uint64_t used_bytes;      /* by every process */
    uint64_t free_bytes;      /* total - used (cpu: MemAvailable) */
    uint64_t self_bytes;      /* allocated by this process through this handle */
    /* cpu: total = MemTotal, free = MemAvailable, used = total - free (every
     * process on the machine). sim-gpu: total = capacity, used = sum over the
     * live processes' handles, exact to the byte. */
} dev_memory;

typedef struct dev_device dev_device;

/* spec: "cpu", "sim-gpu:NAME" (NAME: 1-48 of [A-Za-z0-9_-]), "cuda:N".
 * Errors: SW_EINVAL (bad spec), SW_EUNSUPPORTED (cuda in a build without
 * it), SW_ENOTFOUND (sim pool missing and no capacity given). */
int dev_open(const char *spec, const dev_options *opts, dev_device **out, sw_error *err);
/* Frees nothing the caller still holds: close after freeing allocations.
 * Whatever this process still holds in a sim pool is returned. */
void dev_close(dev_device *dev);

dev_kind dev_get_kind(const dev_device *dev);
const char *dev_kind_name(dev_kind kind);     /* "cpu", "sim-gpu", "cuda" */
const char *dev_spec(const dev_device *dev);  /* as opened, e.g. "sim-gpu:demo" */
bool dev_is_simulated(const dev_device *dev);

/* Allocates bytes (64-byte aligned; 0 bytes gives a valid pointer);
 * SW_EDEVOOM with a message giving the bytes asked, used and total when it
 * does not fit (or a fault is injected, which the message says). Never
 * succeeds partially: on error *out is untouched and nothing is held. cpu
 * refuses a single allocation above MemAvailable (Linux would overcommit
 * and let the OOM killer decide later). sim-gpu: SW_ENOMEM if the host
 * itself refuses the backing memory. `purpose` names the allocation in logs
 * ("weights", "kv"). */
int dev_alloc(dev_device *dev, size_t bytes, const char *purpose, void **out, sw_error *err);
/* Returns an allocation; bytes must be what was asked. NULL is a no-op. */
void dev_free(dev_device *dev, void *ptr, size_t bytes);

int dev_memory_info(dev_device *dev, dev_memory *out, sw_error *err);

/* Copies host data into device memory (memcpy on cpu and sim-gpu). */
int dev_upload(dev_device *dev, void *dst, const void *src, size_t bytes, sw_error *err);

/* Removes a sim-gpu pool's name from the system (tests, `spillway hog
 * --unlink`); processes that have it open keep working. A pool also goes
 * by itself when its last handle closes (dev_close), unless a process
 * that had it open ran with SPILLWAY_SIM_KEEP=1; a pool left behind by
 * processes that died, and used by none, is replaced by an opener that
 * asks for another capacity. */
int dev_sim_unlink(const char *name, sw_error *err);

#endif
