/* A fault for the tests, loaded into a broker with LD_PRELOAD (tests/core/test_fsync_failure.py,
 * tests/commitlog/test_flusher.py).
 *
 * While the file named by $EB_FAULT_FLAG exists, fsync() and fdatasync() fail with EIO on
 * every descriptor whose path (read from /proc/self/fd) contains $EB_FAULT_PATH; otherwise, and
 * for other files, they do what libc does. With $EB_FAULT_MODE=hang they do not fail but wait,
 * as for a disk that does not answer, until the flag file is gone (creating $EB_FAULT_FLAG.waiting
 * when they begin to), then sync. The code under test runs unchanged: the fault comes from where
 * a failing disk would report it. */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>

#include "fault.h"

/* `name` (fsync or fdatasync) of libc, unless it is to fail. */
static int sync_call(int fd, int (**real)(int), const char *name)
{
    if (failing(fd)) {
        const char *mode = getenv("EB_FAULT_MODE");
        if (mode == NULL || strcmp(mode, "hang") != 0) {
            errno = EIO;
            return -1;
        }
        char waiting[4096];
        snprintf(waiting, sizeof waiting, "%s.waiting", getenv("EB_FAULT_FLAG"));
        FILE *mark = fopen(waiting, "w");
        if (mark != NULL)
            fclose(mark);
        while (failing(fd))
            usleep(10000);
    }
    if (*real == NULL)
        *real = (int (*)(int))dlsym(RTLD_NEXT, name);
    return (*real)(fd);
}

EB_INTERPOSE_SYNC(sync_call)
