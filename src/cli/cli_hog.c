/* cli_hog.c - `spillway hog`: takes device memory and holds it until told
 * to stop, the way a second model fills a GPU in the drill.
 *
 *   spillway hog --device D [--sim-capacity BYTES] (--bytes N | --leave N) [--unlink]
 *
 * --leave N takes all of the device's free memory but N bytes, measured
 * after the device is open (on cuda:N this process's own CUDA context
 * already holds its share then), so a drill can leave a GPU worker an exact
 * margin. Prints one line on stdout once the memory is held (the signal for scripts
 * and tests to go on), then waits for SIGTERM or SIGINT, frees and exits 0.
 * On cpu the pages are written so the memory is really taken; on sim-gpu
 * only the pool's accounting matters, so the host pages are left untouched.
 * --unlink removes a sim-gpu pool's name when the hog exits (processes that
 * have it open keep working).
 *
 * Exit status: 0 after a signal, 1 device error, 2 usage, 3 the allocation
 * did not fit (SW_EDEVOOM, message on stderr).
 */
#include "cli/cli.h"

#include "common/units.h"
#include "device/device.h"

#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t hog_stop;

static void hog_on_signal(int sig) { hog_stop = sig; }

static void usage(FILE *out)
{
    fprintf(out,
            "usage: spillway hog --device D (--bytes N | --leave N) [--sim-capacity BYTES] "
            "[--unlink]\n"
            "  hold N bytes (e.g. 2GiB) of device D (cpu, sim-gpu:NAME, cuda:N) until "
            "SIGTERM/SIGINT.\n"
            "  --leave N       take all the free memory but N bytes instead\n"
            "  --sim-capacity  create the sim-gpu pool with this capacity if it is missing\n"
            "  --unlink        remove the sim-gpu pool's name on exit\n"
            "  exit status 3: the memory did not fit\n");
}

int cli_hog_main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"device", required_argument, 0, 'd'},  {"bytes", required_argument, 0, 'b'},
        {"sim-capacity", required_argument, 0, 'c'}, {"unlink", no_argument, 0, 'u'},
        {"leave", required_argument, 0, 'l'},   {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *spec = NULL;
    uint64_t bytes = 0;
    uint64_t leave = 0;
    bool have_bytes = false, have_leave = false, unlink_pool = false;
    dev_options opts = {0};
    dev_device *dev = NULL;
    dev_memory mem;
    sw_error err;
    void *ptr = NULL;
    sigset_t block, old_mask;
    struct sigaction sa;
    int c, status = 1, rc;
    char held[SW_BYTES_STR_MAX], used[SW_BYTES_STR_MAX], total[SW_BYTES_STR_MAX];

    optind = 1;
    while ((c = getopt_long(argc, argv, "d:b:c:l:uh", longopts, NULL)) != -1) {
        switch (c) {
        case 'd': spec = optarg; break;
        case 'b':
            if (sw_parse_bytes(optarg, &bytes) != 0) {
                fprintf(stderr, "spillway hog: bad --bytes '%s' (e.g. 512MiB)\n", optarg);
                return 2;
            }
            have_bytes = true;
            break;
        case 'c':
            if (sw_parse_bytes(optarg, &opts.sim_capacity_bytes) != 0 ||
                opts.sim_capacity_bytes == 0) {
                fprintf(stderr, "spillway hog: bad --sim-capacity '%s' (e.g. 4GiB)\n", optarg);
                return 2;
            }
            break;
        case 'l':
            if (sw_parse_bytes(optarg, &leave) != 0) {
                fprintf(stderr, "spillway hog: bad --leave '%s' (e.g. 64MiB)\n", optarg);
                return 2;
            }
            have_leave = true;
            break;
        case 'u': unlink_pool = true; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!spec || have_bytes == have_leave || optind != argc) {
        usage(stderr);
        return 2;
    }
    if (bytes > SIZE_MAX) {
        fprintf(stderr, "spillway hog: --bytes too large for this machine\n");
        return 2;
    }

    /* Signals are blocked until the wait, so one arriving early is not lost:
     * sigsuspend below delivers it. */
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = hog_on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    sigprocmask(SIG_BLOCK, &block, &old_mask);

    if ((rc = dev_open(spec, &opts, &dev, &err)) != 0) {
        fprintf(stderr, "spillway hog: %s\n", err.message);
        status = rc == SW_EINVAL ? 2 : 1;
        goto done;
    }
    if (have_leave) {
        if ((rc = dev_memory_info(dev, &mem, &err)) != 0) {
            fprintf(stderr, "spillway hog: %s\n", err.message);
            goto done;
        }
        if (mem.free_bytes <= leave) {
            fprintf(stderr, "spillway hog: %s has %" PRIu64 " bytes free, not more than "
                    "--leave %" PRIu64 "\n", dev_spec(dev), mem.free_bytes, leave);
            status = 3;
            goto done;
        }
        bytes = mem.free_bytes - leave;
        if (bytes > SIZE_MAX) {
            fprintf(stderr, "spillway hog: too much to take on this machine\n");
            goto done;
        }
    }
    if ((rc = dev_alloc(dev, (size_t)bytes, "hog", &ptr, &err)) != 0) {
        fprintf(stderr, "spillway hog: %s\n", err.message);
        status = rc == SW_EDEVOOM ? 3 : 1;
        goto done;
    }
    if (dev_get_kind(dev) == DEV_KIND_CPU) {
        long page = sysconf(_SC_PAGESIZE);
        for (uint64_t off = 0; off < bytes; off += (uint64_t)(page > 0 ? page : 4096))
            ((volatile unsigned char *)ptr)[off] = 1;
    }
    if ((rc = dev_memory_info(dev, &mem, &err)) != 0) {
        fprintf(stderr, "spillway hog: %s\n", err.message);
        goto done;
    }
    printf("hog: holding %s (%" PRIu64 " bytes) of %s%s; device %s used of %s; pid %ld\n",
           sw_format_bytes(bytes, held, sizeof held), bytes, dev_spec(dev),
           dev_is_simulated(dev) ? " (simulated)" : "",
           sw_format_bytes(mem.used_bytes, used, sizeof used),
           sw_format_bytes(mem.total_bytes, total, sizeof total), (long)getpid());
    fflush(stdout);

    while (!hog_stop)
        sigsuspend(&old_mask);
    status = 0;
done:
    if (dev) {
        dev_free(dev, ptr, (size_t)bytes);
        dev_close(dev);
    }
    if (unlink_pool && spec && strncmp(spec, "sim-gpu:", 8) == 0 &&
        dev_sim_unlink(spec + 8, &err) != 0 && err.code != SW_ENOTFOUND)
        fprintf(stderr, "spillway hog: %s\n", err.message);
    sigprocmask(SIG_SETMASK, &old_mask, NULL);
    return status;
}
