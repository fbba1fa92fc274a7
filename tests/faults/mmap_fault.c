/* A fault for the tests, loaded with LD_PRELOAD (tests/commitlog/test_commitlog.py).
 *
 * While the file named by $EB_FAULT_FLAG exists, a read-only shared mmap() of a file whose path
 * (read from /proc/self/fd) contains $EB_FAULT_PATH fails with ENOMEM, as when the process has
 * used up its memory maps (vm.max_map_count); every other mmap() is libc's. The code under test
 * runs unchanged: the failure comes from where the kernel would report it. */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <sys/mman.h>
#include <sys/types.h>

#include "fault.h"

static void *map(void *addr, size_t length, int prot, int flags, int fd, off_t offset,
                 void *(**real)(void *, size_t, int, int, int, off_t), const char *name)
{
    if (prot == PROT_READ && (flags & MAP_SHARED) && failing(fd)) {
        errno = ENOMEM;
        return MAP_FAILED;
    }
    if (*real == NULL)
        *real = (void *(*)(void *, size_t, int, int, int, off_t))dlsym(RTLD_NEXT, name);
    return (*real)(addr, length, prot, flags, fd, offset);
}

void *mmap(void *addr, size_t length, int prot, int flags, int fd, off_t offset)
{
    static void *(*real)(void *, size_t, int, int, int, off_t);
    return map(addr, length, prot, flags, fd, offset, &real, "mmap");
}

void *mmap64(void *addr, size_t length, int prot, int flags, int fd, off_t offset)
{
    static void *(*real)(void *, size_t, int, int, int, off_t);
    return map(addr, length, prot, flags, fd, offset, &real, "mmap64");
}
