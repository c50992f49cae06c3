/* sim_pool.c - the sim-gpu device: a fixed-capacity memory pool shared by
 * every process on the machine that opens the same name.
 *
 * It stands in for a GPU's memory on machines without one, so that memory
 * pressure between processes (a second model, a hog, a long context) is real
 * in tests and demos. The memory handed out is ordinary host memory; what is
 * shared is the *accounting*: a POSIX shared memory object
 * "/spillway-sim-NAME" (visible as /dev/shm/spillway-sim-NAME) holds the
 * capacity and one slot per open handle {pid, process start time, bytes},
 * guarded by a process-shared robust mutex.
 *
 * One slot per handle, not per process: closing one handle returns exactly
 * what that handle holds, and two engines in one process do not disturb each
 * other. A handle holds its slot from dev_open to dev_close.
 *
 * Crash safety, as a driver gives VRAM back when a process dies:
 *   - every operation that takes the lock first reclaims the slots of dead
 *     processes: kill(pid, 0) says ESRCH, or /proc/PID/stat says zombie, or
 *     the start time in /proc/PID/stat (field 22) differs from the one
 *     recorded, which means the pid was reused by a newer process;
 *   - the mutex is robust: a process killed while holding it does not wedge
 *     the pool; the next locker gets EOWNERDEAD and marks it consistent
 *     (every update under the lock is a few single-word stores into one
 *     slot, and the dead owner's slot is reclaimed right after);
 *   - locking has a time-out (SIM_POOL_LOCK_TIMEOUT_MS), so a live process
 *     stopped while holding the lock (SIGSTOP) yields an error, not a hang.
 * Lifetime: the pool goes with its last user. The handle that closes
 * last removes the name (and marks the object removed, under the lock, so
 * that a process that mapped it in between opens again and creates a new
 * one), unless a process that had it open ran with SPILLWAY_SIM_KEEP=1
 * (the keep mark stays with the pool). A pool whose users all died is
 * still there (no one closed it): an opener that asks for another capacity
 * replaces it, one that asks for none or the same adopts it.
 * Creation: O_CREAT|O_EXCL decides one creator, which sizes and initialises
 * the object and then publishes the magic number (release store); other
 * openers wait up to SIM_POOL_READY_MS for it. A creator that died before
 * publishing leaves a pool that never becomes ready: openers then fail with a
 * message saying to unlink it.
 *
 * The object is created with mode 0600: only the same user shares a pool.
 * Always reported as simulated (every log line says so).
 *
 * Limits: pids are compared in the caller's pid namespace, so processes in
 * different containers must not share a pool; a process that exec()s keeps
 * its slot (same pid, same start time) until it exits.
 */
#include "device/sim/sim_pool.h"

#include "common/alloc.h"
#include "common/log.h"
#include "device/device-impl.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SIM_POOL_MAGIC 0x4c4f4f504d495357ULL /* "SWIMPOOL" little-endian */
#define SIM_POOL_VERSION 2u
#define SIM_POOL_READY_MS 2000
#define SIM_SHM_PREFIX "/spillway-sim-"
#define SIM_SHM_NAME_MAX (sizeof SIM_SHM_PREFIX + SIM_POOL_NAME_MAX)

typedef struct sim_slot {
    int64_t pid;         /* 0: free */
    uint64_t start_time; /* /proc/PID/stat field 22 (clock ticks since boot) */
    uint64_t bytes;      /* held through this handle */
} sim_slot;

/* The shared object. Its layout is the file format of the pool: a change
 * bumps SIM_POOL_VERSION. */
typedef struct sim_shared {
    _Atomic uint64_t magic; /* SIM_POOL_MAGIC once initialised; written last */
    uint32_t version;
    uint32_t n_slots;
    uint64_t shared_bytes; /* sizeof(sim_shared) of the creator */
    uint64_t capacity_bytes;
    pthread_mutex_t lock; /* process-shared, robust; guards slots, keep, removed */
    uint32_t keep;        /* 1: stays when its last handle closes (SPILLWAY_SIM_KEEP=1) */
    uint32_t removed;     /* 1: its name is gone; whoever mapped it opens again */
    sim_slot slots[SIM_POOL_SLOTS];
} sim_shared;

typedef struct sim_handle {
    sim_shared *shared; /* mmap of the whole object */
    int slot;           /* this handle's slot */
    bool look_only;     /* dev_options.sim_no_create: the pool is left as found */
    char name[SIM_POOL_NAME_MAX + 1];
} sim_handle;

bool dev__sim_name_valid(const char *name)
{
    size_t len = strlen(name);
    if (len == 0 || len > SIM_POOL_NAME_MAX)
        return false;
    for (size_t i = 0; i < len; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-'))
            return false;
    }
    return true;
}

static void shm_name_of(const char *name, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s%s", SIM_SHM_PREFIX, name);
}

static void sleep_ms(long ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* State letter and start time (field 22) of a process from /proc/PID/stat.
 * SW_ENOTFOUND if the process does not exist, SW_EIO if unreadable. */
static int read_proc_stat(long pid, char *state, uint64_t *start_time)
{
    char path[64], buf[1024];
    ssize_t len;
    int fd;
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT || errno == ESRCH ? SW_ENOTFOUND : SW_EIO;
    len = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (len <= 0)
        return len == 0 || errno == ESRCH ? SW_ENOTFOUND : SW_EIO;
    buf[len] = '\0';
    /* "pid (comm) S ppid ...": comm may hold spaces and ')', so fields are
     * counted after the last ')'. Field 3 is the state, field 22 the start. */
    char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ' || !p[2])
        return SW_EIO;
    p += 2;
    *state = *p;
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (!p)
            return SW_EIO;
        p++;
    }
    char *end;
    errno = 0;
    unsigned long long value = strtoull(p, &end, 10);
    if (errno || end == p)
        return SW_EIO;
    *start_time = value;
    return SW_OK;
}

static bool process_alive(int64_t pid, uint64_t start_time)
{
    char state;
    uint64_t now_start;
    if (pid <= 0)
        return false;
    if (kill((pid_t)pid, 0) != 0 && errno == ESRCH)
        return false;
    int rc = read_proc_stat((long)pid, &state, &now_start);
    if (rc == SW_ENOTFOUND)
        return false;
    if (rc != SW_OK)
        return true; /* cannot tell (e.g. /proc hidden): trust kill() */
    if (state == 'Z' || state == 'X')
        return false; /* exited, not yet reaped: its memory is gone */
    return now_start == start_time;
}

static int pool_lock(sim_handle *h, const char *spec, sw_error *err)
{
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += SIM_POOL_LOCK_TIMEOUT_MS / 1000;
    deadline.tv_nsec += (SIM_POOL_LOCK_TIMEOUT_MS % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    int rc = pthread_mutex_timedlock(&h->shared->lock, &deadline);
    if (rc == EOWNERDEAD) {
        SW_WARN("device", "%s (simulated): a process died holding the pool lock; recovered",
                spec);
        pthread_mutex_consistent(&h->shared->lock);
        return SW_OK;
    }
    if (rc == 0)
        return SW_OK;
    if (rc == ETIMEDOUT)
        return sw_error_set(err, SW_ETIMEOUT,
                            "%s (simulated): pool lock held by another process for over %d ms "
                            "(a stopped process?)",
                            spec, SIM_POOL_LOCK_TIMEOUT_MS);
    return sw_error_set(err, SW_EDEVICE, "%s (simulated): cannot lock the pool: %s", spec,
                        strerror(rc));
}

static void pool_unlock(sim_handle *h) { pthread_mutex_unlock(&h->shared->lock); }

/* Under the lock: frees the slots of dead processes. */
static void reclaim_dead(sim_handle *h, const char *spec)
{
    sim_shared *s = h->shared;
    for (uint32_t i = 0; i < SIM_POOL_SLOTS; i++) {
        sim_slot *slot = &s->slots[i];
        if (slot->pid == 0 || process_alive(slot->pid, slot->start_time))
            continue;
        if (slot->bytes > 0) {
            char held[DEV_BYTES_STR_MAX];
            SW_INFO("device", "%s (simulated): reclaimed %s from dead process %" PRId64, spec,
                    dev__bytes_str(slot->bytes, held, sizeof held), slot->pid);
        }
        slot->bytes = 0;
        slot->start_time = 0;
        slot->pid = 0;
    }
}

/* Under the lock: bytes held by all live slots (saturating). */
static uint64_t pool_used(const sim_shared *s)
{
    uint64_t used = 0;
    for (uint32_t i = 0; i < SIM_POOL_SLOTS; i++)
        if (s->slots[i].pid != 0 && __builtin_add_overflow(used, s->slots[i].bytes, &used))
            return UINT64_MAX;
    return used;
}

/* Under the lock: whether any slot is held (call reclaim_dead first). */
static bool pool_in_use(const sim_shared *s)
{
    for (uint32_t i = 0; i < SIM_POOL_SLOTS; i++)
        if (s->slots[i].pid != 0)
            return true;
    return false;
}

/* Under the lock: removes the pool's name when no process uses it and none
 * asked to keep it, so that it goes with its last user as a GPU's memory
 * goes with the driver's last client. Marked first: a process that mapped
 * it but holds no slot yet sees the mark once it has the lock and opens
 * again (a new pool). true when it was removed. */
static bool remove_if_unused(sim_handle *h, const char *spec)
{
    sim_shared *s = h->shared;
    if (s->keep || s->removed || pool_in_use(s))
        return false;
    char shm_name[SIM_SHM_NAME_MAX];
    shm_name_of(h->name, shm_name, sizeof shm_name);
    s->removed = 1;
    if (shm_unlink(shm_name) != 0 && errno != ENOENT) {
        SW_WARN("device", "%s (simulated): cannot remove the unused pool %s: %s", spec, shm_name,
                strerror(errno));
        return false;
    }
    return true;
}

static void init_shared(sim_shared *s, uint64_t capacity)
{
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&s->lock, &attr);
    pthread_mutexattr_destroy(&attr);
    s->version = SIM_POOL_VERSION;
    s->n_slots = SIM_POOL_SLOTS;
    s->shared_bytes = sizeof(sim_shared);
    s->capacity_bytes = capacity;
    s->keep = 0;
    s->removed = 0;
    memset(s->slots, 0, sizeof s->slots);
    atomic_store_explicit(&s->magic, SIM_POOL_MAGIC, memory_order_release);
}

/* Maps the object once it has its full size and its creator published the
 * magic number. */
static int map_existing(int fd, const char *spec, const char *shm_name, sim_shared **out,
                        sw_error *err)
{
    int64_t deadline = now_ms() + SIM_POOL_READY_MS;
    struct stat st;
    sim_shared *s;

    for (;;) {
        if (fstat(fd, &st) != 0)
            return sw_error_set(err, SW_EIO, "%s (simulated): fstat %s: %s", spec, shm_name,
                                strerror(errno));
        if ((uint64_t)st.st_size >= sizeof(sim_shared))
            break;
        if (st.st_size > 0)
            return sw_error_set(err, SW_EFORMAT,
                                "%s (simulated): /dev/shm%s is %lld bytes, not a pool of this "
                                "spillway version; remove it with rm /dev/shm%s",
                                spec, shm_name, (long long)st.st_size, shm_name);
        if (now_ms() > deadline)
            return sw_error_set(err, SW_EDEVICE,
                                "%s (simulated): /dev/shm%s was never sized (its creator "
                                "died?); remove it with rm /dev/shm%s",
                                spec, shm_name, shm_name);
        sleep_ms(1);
    }
    s = mmap(NULL, sizeof(sim_shared), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (s == MAP_FAILED)
        return sw_error_set(err, SW_EIO, "%s (simulated): mmap %s: %s", spec, shm_name,
                            strerror(errno));
    while (atomic_load_explicit(&s->magic, memory_order_acquire) != SIM_POOL_MAGIC) {
        if (now_ms() > deadline) {
            munmap(s, sizeof(sim_shared));
            return sw_error_set(err, SW_EDEVICE,
                                "%s (simulated): pool /dev/shm%s never became ready (its "
                                "creator died?); remove it with rm /dev/shm%s",
                                spec, shm_name, shm_name);
        }
        sleep_ms(1);
    }
    if (s->version != SIM_POOL_VERSION || s->n_slots != SIM_POOL_SLOTS ||
        s->shared_bytes != sizeof(sim_shared)) {
        munmap(s, sizeof(sim_shared));
        return sw_error_set(err, SW_EFORMAT,
                            "%s (simulated): pool was made by another spillway version "
                            "(layout %u); remove /dev/shm%s",
                            spec, (unsigned)s->version, shm_name);
    }
    *out = s;
    return SW_OK;
}

/* Creates the pool (when a capacity is given and it does not exist) or maps
 * the existing one. *created says which. */
static int map_pool(const char *spec, const char *name, uint64_t capacity, bool no_create,
                    sim_shared **out, bool *created, sw_error *err)
{
    char shm_name[SIM_SHM_NAME_MAX];
    shm_name_of(name, shm_name, sizeof shm_name);

    /* A pool can vanish (unlinked) between the failed O_EXCL and the open:
     * then creating is tried again. */
    for (int attempt = 0; attempt < 5; attempt++) {
        int fd, rc;
        if (capacity > 0 && !no_create) {
            fd = shm_open(shm_name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
            if (fd >= 0) {
                sim_shared *s;
                if (ftruncate(fd, (off_t)sizeof(sim_shared)) != 0) {
                    rc = sw_error_set(err, SW_EIO, "%s (simulated): sizing %s: %s", spec,
                                      shm_name, strerror(errno));
                    close(fd);
                    shm_unlink(shm_name);
                    return rc;
                }
                s = mmap(NULL, sizeof(sim_shared), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
                close(fd);
                if (s == MAP_FAILED) {
                    rc = sw_error_set(err, SW_EIO, "%s (simulated): mmap %s: %s", spec, shm_name,
                                      strerror(errno));
                    shm_unlink(shm_name);
                    return rc;
                }
                init_shared(s, capacity);
                *out = s;
                *created = true;
                return SW_OK;
            }
            if (errno != EEXIST)
                return sw_error_set(err, SW_EIO, "%s (simulated): creating %s: %s", spec,
                                    shm_name, strerror(errno));
        }
        fd = shm_open(shm_name, O_RDWR | O_CLOEXEC, 0);
        if (fd < 0) {
            if (errno == ENOENT && no_create)
                return sw_error_set(err, SW_ENOTFOUND, "%s (simulated): no such pool", spec);
            if (errno == ENOENT && capacity == 0)
                return sw_error_set(err, SW_ENOTFOUND,
                                    "%s (simulated): no such pool; pass a capacity "
                                    "(--sim-capacity BYTES) to create it",
                                    spec);
            if (errno == ENOENT)
                continue;
            return sw_error_set(err, SW_EIO, "%s (simulated): opening %s: %s", spec, shm_name,
                                strerror(errno));
        }
        rc = map_existing(fd, spec, shm_name, out, err);
        close(fd);
        if (rc == SW_EFORMAT && capacity > 0 && !no_create) {
            /* another spillway version's pool (an older build's, left
             * behind): its users, if any, keep their mapping; this one
             * gets a pool of its own version */
            SW_WARN("sim", "%s: replacing /dev/shm%s, a pool of another spillway version",
                    spec, shm_name);
            shm_unlink(shm_name);
            continue;
        }
        if (rc == SW_OK)
            *created = false;
        return rc;
    }
    return sw_error_set(err, SW_EDEVICE,
                        "%s (simulated): pool kept disappearing while being opened", spec);
}

static int sim_open(dev_device *dev, const char *name, const dev_options *opts, sw_error *err)
{
    char state, cap_str[DEV_BYTES_STR_MAX], asked_str[DEV_BYTES_STR_MAX];
    char used_str[DEV_BYTES_STR_MAX];
    uint64_t my_start;
    sim_handle *h = NULL;
    bool created = false;
    int rc;

    if (!dev__sim_name_valid(name))
        return sw_error_set(err, SW_EINVAL,
                            "bad device '%s': the pool name must be 1-%d of A-Z a-z 0-9 _ -",
                            dev->spec, SIM_POOL_NAME_MAX);
    if (read_proc_stat((long)getpid(), &state, &my_start) != SW_OK)
        return sw_error_set(err, SW_EIO, "%s (simulated): cannot read /proc/self/stat",
                            dev->spec);
    h = sw_calloc(1, sizeof *h);
    if (!h)
        return sw_error_set(err, SW_ENOMEM, "out of host memory opening %s", dev->spec);
    snprintf(h->name, sizeof h->name, "%s", name);
    h->slot = -1;
    h->look_only = opts->sim_no_create;
    const char *keep_env = getenv("SPILLWAY_SIM_KEEP");
    bool keep = keep_env && !strcmp(keep_env, "1");
    uint64_t capacity = 0, used = 0;
    /* Opened again when the pool found was removed under us (its last user
     * closed it), or was one no live process used and of another capacity
     * than asked (left by processes that died): then it is replaced. */
    for (int attempt = 0;; attempt++) {
        if (attempt == 20) {
            rc = sw_error_set(err, SW_EDEVICE,
                              "%s (simulated): pool kept disappearing while being opened",
                              dev->spec);
            goto fail;
        }
        if ((rc = map_pool(dev->spec, name, opts->sim_capacity_bytes, opts->sim_no_create,
                           &h->shared, &created, err)))
            goto fail;
        if ((rc = pool_lock(h, dev->spec, err)) != SW_OK)
            goto fail;
        if (h->shared->removed) {
            pool_unlock(h);
            munmap(h->shared, sizeof(sim_shared));
            h->shared = NULL;
            continue;
        }
        reclaim_dead(h, dev->spec);
        capacity = h->shared->capacity_bytes;
        if (opts->sim_capacity_bytes != 0 && opts->sim_capacity_bytes != capacity) {
            bool unused = !pool_in_use(h->shared);
            bool replaced = !opts->sim_no_create && remove_if_unused(h, dev->spec);
            pool_unlock(h);
            if (unused && !h->shared->keep && opts->sim_no_create) {
                /* a real open would replace it: for a look, there is none */
                munmap(h->shared, sizeof(sim_shared));
                h->shared = NULL;
                rc = sw_error_set(err, SW_ENOTFOUND, "%s (simulated): no pool in use", dev->spec);
                goto fail;
            }
            munmap(h->shared, sizeof(sim_shared));
            h->shared = NULL;
            if (replaced) {
                SW_INFO("device", "%s (simulated): removed the unused pool of %s to create one "
                        "of %s", dev->spec, dev__bytes_str(capacity, cap_str, sizeof cap_str),
                        dev__bytes_str(opts->sim_capacity_bytes, asked_str, sizeof asked_str));
                continue;
            }
            rc = sw_error_set(err, SW_EINVAL,
                              "%s (simulated): the pool exists with capacity %s, %s, not the %s "
                              "asked (pass no capacity to use it, or use another pool name)",
                              dev->spec, dev__bytes_str(capacity, cap_str, sizeof cap_str),
                              unused ? "kept (SPILLWAY_SIM_KEEP=1; remove it with spillway hog "
                                       "--unlink or rm /dev/shm/spillway-sim-NAME)"
                                     : "in use by another process",
                              dev__bytes_str(opts->sim_capacity_bytes, asked_str,
                                             sizeof asked_str));
            goto fail;
        }
        break;
    }
    for (int i = 0; i < SIM_POOL_SLOTS; i++) {
        if (h->shared->slots[i].pid == 0) {
            h->slot = i;
            break;
        }
    }
    if (h->slot >= 0) {
        sim_slot *slot = &h->shared->slots[h->slot];
        slot->bytes = 0;
        slot->start_time = my_start;
        slot->pid = getpid(); /* last: a slot with a pid is complete */
        if (keep && !h->look_only)
            h->shared->keep = 1;
    }
    used = pool_used(h->shared);
    pool_unlock(h);
    if (h->slot < 0) {
        rc = sw_error_set(err, SW_EDEVICE, "%s (simulated): all %d handle slots of the pool are "
                          "in use by live processes", dev->spec, SIM_POOL_SLOTS);
        goto fail;
    }
    SW_INFO("device", "%s (simulated GPU): %s pool of %s, %s used", dev->spec,
            created ? "created" : "opened", dev__bytes_str(capacity, cap_str, sizeof cap_str),
            dev__bytes_str(used, used_str, sizeof used_str));
    dev->impl = h;
    return SW_OK;
fail:
    if (h->shared)
        munmap(h->shared, sizeof(sim_shared));
    sw_free(h);
    return rc;
}

static void sim_close(dev_device *dev)
{
    sim_handle *h = dev->impl;
    if (!h)
        return;
    /* A forked child closing an inherited handle only unmaps: the slot is
     * the parent's. */
    if (dev->owner_pid == getpid()) {
        if (pool_lock(h, dev->spec, NULL) == SW_OK) {
            sim_slot *slot = &h->shared->slots[h->slot];
            if (slot->pid == (int64_t)getpid()) {
                slot->pid = 0;
                slot->bytes = 0;
                slot->start_time = 0;
            }
            bool removed = false;
            if (!h->look_only) {
                reclaim_dead(h, dev->spec);
                removed = remove_if_unused(h, dev->spec);
            }
            pool_unlock(h);
            if (removed)
                SW_INFO("device", "%s (simulated): pool removed with its last user "
                        "(SPILLWAY_SIM_KEEP=1 keeps it)", dev->spec);
        } else {
            SW_ERROR("device", "%s (simulated): could not lock the pool to close; its bytes "
                     "return when this process exits", dev->spec);
        }
    }
    munmap(h->shared, sizeof(sim_shared));
    sw_free(h);
}

/* The handle's slot no longer names this process: something (another
 * process that misread /proc, a forged start time in a test) reclaimed it.
 * Accounting through it would charge or credit whoever holds it now. */
static int slot_lost(dev_device *dev, sw_error *err)
{
    SW_ERROR("device", "%s (simulated): this handle's pool slot was reclaimed while the process "
             "was alive; reopen the device", dev->spec);
    return sw_error_set(err, SW_EDEVICE,
                        "%s (simulated): this handle's pool slot was reclaimed; reopen the device",
                        dev->spec);
}

static int sim_alloc(dev_device *dev, size_t bytes, void **out, sw_error *err)
{
    sim_handle *h = dev->impl;
    sim_shared *s = h->shared;
    char asked[DEV_BYTES_STR_MAX], used_str[DEV_BYTES_STR_MAX], cap_str[DEV_BYTES_STR_MAX];
    uint64_t used = 0;
    void *ptr;
    int rc;

    /* Host memory first, so a refused host allocation needs no rollback of
     * the shared accounting; an ask above the capacity is refused before
     * touching the host at all. */
    if ((uint64_t)bytes <= s->capacity_bytes) {
        ptr = sw_aligned_alloc(DEV_ALIGNMENT, bytes);
        if (!ptr)
            return sw_error_set(err, SW_ENOMEM,
                                "out of host memory backing %s (simulated): asked %s", dev->spec,
                                dev__bytes_str(bytes, asked, sizeof asked));
        if ((rc = pool_lock(h, dev->spec, err)) != SW_OK) {
            sw_free(ptr);
            return rc;
        }
        reclaim_dead(h, dev->spec);
        if (s->slots[h->slot].pid != (int64_t)getpid()) {
            pool_unlock(h);
            sw_free(ptr);
            return slot_lost(dev, err);
        }
        used = pool_used(s);
        if (used <= s->capacity_bytes && (uint64_t)bytes <= s->capacity_bytes - used) {
            s->slots[h->slot].bytes += bytes;
            pool_unlock(h);
            *out = ptr;
            return SW_OK;
        }
        pool_unlock(h);
        sw_free(ptr);
    } else if (pool_lock(h, dev->spec, NULL) == SW_OK) {
        reclaim_dead(h, dev->spec);
        used = pool_used(s);
        pool_unlock(h);
    }
    SW_DEBUG("device", "%s (simulated): refused %s, %s used of %s", dev->spec,
             dev__bytes_str(bytes, asked, sizeof asked),
             dev__bytes_str(used, used_str, sizeof used_str),
             dev__bytes_str(s->capacity_bytes, cap_str, sizeof cap_str));
    return sw_error_set(err, SW_EDEVOOM, "%s out of memory: asked %s, %s used of %s (simulated)",
                        dev->spec, dev__bytes_str(bytes, asked, sizeof asked),
                        dev__bytes_str(used, used_str, sizeof used_str),
                        dev__bytes_str(s->capacity_bytes, cap_str, sizeof cap_str));
}

static void sim_free(dev_device *dev, void *ptr, size_t bytes)
{
    sim_handle *h = dev->impl;
    if (pool_lock(h, dev->spec, NULL) == SW_OK) {
        sim_slot *slot = &h->shared->slots[h->slot];
        if (slot->pid == (int64_t)getpid())
            slot->bytes -= (uint64_t)bytes <= slot->bytes ? (uint64_t)bytes : slot->bytes;
        pool_unlock(h);
    } else {
        SW_ERROR("device", "%s (simulated): could not lock the pool to free %zu bytes; they "
                 "return when this handle closes", dev->spec, bytes);
    }
    sw_free(ptr);
}

static int sim_memory_info(dev_device *dev, dev_memory *out, sw_error *err)
{
    sim_handle *h = dev->impl;
    sim_shared *s = h->shared;
    int rc = pool_lock(h, dev->spec, err);
    if (rc != SW_OK)
        return rc;
    reclaim_dead(h, dev->spec);
    uint64_t used = pool_used(s);
    uint64_t self = s->slots[h->slot].pid == (int64_t)getpid() ? s->slots[h->slot].bytes : 0;
    pool_unlock(h);
    out->total_bytes = s->capacity_bytes;
    out->used_bytes = used;
    out->free_bytes = used < s->capacity_bytes ? s->capacity_bytes - used : 0;
    out->self_bytes = self;
    return SW_OK;
}

static int sim_upload(dev_device *dev, void *dst, const void *src, size_t bytes, sw_error *err)
{
    memcpy(dst, src, bytes);
    return SW_OK;
}

int dev_sim_unlink(const char *name, sw_error *err)
{
    char shm_name[SIM_SHM_NAME_MAX];
    if (!name || !dev__sim_name_valid(name))
        return sw_error_set(err, SW_EINVAL,
                            "bad sim-gpu pool name '%.60s': 1-%d of A-Z a-z 0-9 _ -",
                            name ? name : "", SIM_POOL_NAME_MAX);
    shm_name_of(name, shm_name, sizeof shm_name);
    if (shm_unlink(shm_name) != 0) {
        if (errno == ENOENT)
            return sw_error_set(err, SW_ENOTFOUND, "sim-gpu:%s (simulated): no such pool", name);
        return sw_error_set(err, SW_EIO, "sim-gpu:%s (simulated): unlink %s: %s", name,
                            shm_name, strerror(errno));
    }
    SW_INFO("device", "sim-gpu:%s (simulated): pool name removed", name);
    return SW_OK;
}

int dev__sim_die_holding_lock(dev_device *dev, sw_error *err)
{
    int rc;
    if (!dev || dev->backend != &dev__sim_gpu_backend)
        return sw_error_set(err, SW_EINVAL, "not a sim-gpu device");
    if ((rc = pool_lock(dev->impl, dev->spec, err)) != SW_OK)
        return rc;
    raise(SIGKILL);
    return sw_error_set(err, SW_EINTERNAL, "SIGKILL did not kill the process");
}

int dev__sim_forge_start_time(dev_device *dev, long pid, uint64_t start_time, sw_error *err)
{
    sim_handle *h;
    int rc, changed = 0;
    if (!dev || dev->backend != &dev__sim_gpu_backend)
        return sw_error_set(err, SW_EINVAL, "not a sim-gpu device");
    h = dev->impl;
    if ((rc = pool_lock(h, dev->spec, err)) != SW_OK)
        return rc;
    for (int i = 0; i < SIM_POOL_SLOTS; i++) {
        if (h->shared->slots[i].pid == (int64_t)pid) {
            h->shared->slots[i].start_time = start_time;
            changed++;
        }
    }
    pool_unlock(h);
    return changed;
}

const dev_backend dev__sim_gpu_backend = {
    .kind = DEV_KIND_SIM_GPU,
    .name = "sim-gpu",
    .takes_argument = true,
    .simulated = true,
    .open = sim_open,
    .close = sim_close,
    .alloc = sim_alloc,
    .free = sim_free,
    .memory_info = sim_memory_info,
    .upload = sim_upload,
};
