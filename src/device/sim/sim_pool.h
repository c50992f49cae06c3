/* sim_pool.h - internals of the sim-gpu device, for device.c and tests.
 *
 * The pool itself is described in sim_pool.c. Nothing here is public API:
 * callers use device.h ("sim-gpu:NAME").
 */
#ifndef SPILLWAY_DEVICE_SIM_POOL_H
#define SPILLWAY_DEVICE_SIM_POOL_H

#include "device/device.h"

#include <stdbool.h>

#define SIM_POOL_NAME_MAX 48   /* characters of NAME in sim-gpu:NAME */
#define SIM_POOL_SLOTS 256     /* handles open on one pool at once, machine-wide */
#define SIM_POOL_LOCK_TIMEOUT_MS 10000

/* true if NAME is 1-48 of [A-Za-z0-9_-]. */
bool dev__sim_name_valid(const char *name);

/* Test hook: takes the pool's lock of a sim-gpu handle and kills the calling
 * process with SIGKILL while holding it, so tests can check that the robust
 * mutex does not wedge the pool. Returns (an error) only if dev is not a
 * sim-gpu handle or the lock could not be taken. */
int dev__sim_die_holding_lock(dev_device *dev, sw_error *err);

/* Test hook: overwrites the process start time recorded in every slot of
 * the pool that belongs to pid, as if pid had been reused by a newer
 * process. Returns the number of slots changed, or a negative status. */
int dev__sim_forge_start_time(dev_device *dev, long pid, uint64_t start_time, sw_error *err);

#endif
