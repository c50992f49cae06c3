/* bin_testutil.c - see bin_testutil.h. */
#include "bin_testutil.h"

#include "testutil.h"

const char *btu_spillway_bin_or_skip(void)
{
    const char *bin = tu_spillway_bin();
    if (!bin) {
        print_message("SKIP: SPILLWAY_BIN is not set\n");
        skip();
        return NULL;
    }
    return bin;
}
