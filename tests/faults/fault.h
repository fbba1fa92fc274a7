/* What the fault shims share: whether a descriptor is one to fail now. */

#ifndef EB_FAULT_H
#define EB_FAULT_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* True while the file named by $EB_FAULT_FLAG exists, for a descriptor whose path (read from
 * /proc/self/fd) contains $EB_FAULT_PATH. */
static int failing(int fd)
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

#endif
