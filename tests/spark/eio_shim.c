/* LD_PRELOAD shim for tests/spark/test_ingest_read_error.py: a bad sector. Reads of a file whose
   path contains $EIO_MATCH fail with EIO from byte $EIO_AT on: a read starting before it is cut
   short there, one at or after it fails. Built by the test with the C compiler (cc). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/types.h>

static ssize_t (*real_read)(int, void *, size_t);
static ssize_t (*real_pread)(int, void *, size_t, off_t);

static int bad(int fd) {
    const char *m = getenv("EIO_MATCH");
    if (!m || !*m) return 0;
    char p[64], t[4096];
    snprintf(p, sizeof p, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(p, t, sizeof t - 1);
    if (n <= 0) return 0;
    t[n] = 0;
    return strstr(t, m) != NULL;
}

/* -1 (errno EIO) when a read at `cur` starts in the bad sector; else 0, `count` cut to end there. */
static int clamp(off_t cur, size_t *count) {
    const char *s = getenv("EIO_AT");
    off_t at = s ? atol(s) : 0;
    if (cur >= at) { errno = EIO; return -1; }
    if (cur + (off_t)*count > at) *count = at - cur;
    return 0;
}

ssize_t read(int fd, void *buf, size_t count) {
    if (!real_read) real_read = dlsym(RTLD_NEXT, "read");
    if (bad(fd)) {
        off_t cur = lseek(fd, 0, SEEK_CUR);
        if (cur >= 0 && clamp(cur, &count) < 0) return -1;
    }
    return real_read(fd, buf, count);
}

ssize_t pread64(int fd, void *buf, size_t count, off_t off) {
    if (!real_pread) real_pread = dlsym(RTLD_NEXT, "pread64");
    if (bad(fd) && clamp(off, &count) < 0) return -1;
    return real_pread(fd, buf, count, off);
}

ssize_t pread(int fd, void *buf, size_t count, off_t off) { return pread64(fd, buf, count, off); }
