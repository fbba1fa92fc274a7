/* What the fault shims share: whether a descriptor is one to fail now, and the interposed
 * fsync() and fdatasync(). */

#ifndef EB_FAULT_H
#define EB_FAULT_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* True while the file named by $EB_FAULT_FLAG exists, for a descriptor whose path (read from
 * /proc/self/fd) contains $EB_FAULT_PATH. */
static inline int failing(int fd)
{
    const char *flag = getenv("EB_FAULT_FLAG"), *match = getenv("EB_FAULT_PATH");
    char link[64], path[4096];
    ssize_t n;
    if (fd < 0 || flag == NULL || match == NULL || access(flag, F_OK) != 0)
        return 0;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    n = readlink(link, path, sizeof path - 1);
    if (n < 0)
        return 0;
    path[n] = '\0';
    return strstr(path, match) != NULL;
}

/* Define fsync() and fdatasync() as calls of `handler(fd, &real, name)`: `real` holds libc's
 * function of that name once the handler looked it up (dlsym(RTLD_NEXT, name)). */
#define EB_INTERPOSE_SYNC(handler)                                                             \
    int fsync(int fd)                                                                          \
    {                                                                                          \
        static int (*real)(int);                                                               \
        return handler(fd, &real, "fsync");                                                    \
    }                                                                                          \
    int fdatasync(int fd)                                                                      \
    {                                                                                          \
        static int (*real)(int);                                                               \
        return handler(fd, &real, "fdatasync");                                                \
    }

#endif
