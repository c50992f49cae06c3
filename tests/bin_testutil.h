/* bin_testutil.h - the start of a test that runs the spillway binary: its
 * path, or the test skipped with one message, written once for every test
 * file that needs it. */
#ifndef SPILLWAY_BIN_TESTUTIL_H
#define SPILLWAY_BIN_TESTUTIL_H

/* Path of the spillway binary (SPILLWAY_BIN), or NULL after printing
 * "SKIP: SPILLWAY_BIN is not set" and marking the test skipped (the caller
 * must return). */
const char *btu_spillway_bin_or_skip(void);

#endif
