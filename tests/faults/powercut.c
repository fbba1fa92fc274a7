/* A power cut for the tests, loaded into a broker with LD_PRELOAD (tests/core/test_power_cut.py,
 * tests/powercut.py rebuilds what the disk would hold).
 *
 * kill -9 keeps the page cache: everything written survives it, fsynced or not. A power cut
 * keeps only what an fsync made durable. This shim records that: at each fsync() or
 * fdatasync() on a file or directory under $EB_POWER_DIR it saves, in $EB_POWER_SHADOW,
 *
 *   - for a regular file: its whole content at the call, as files/<key>, where the key is the
 *     inode number and its birth time (the content belongs to the inode, whatever names it
 *     has: a file fsynced under a temporary name and renamed keeps it);
 *   - for a directory: its entries at the call, one "<type> <key> <name>" line each (type f
 *     for a regular file, d for a directory, o for anything else), as dirs/<path relative to
 *     $EB_POWER_DIR, "/" written as "%"; the top is "%" alone, a name no relative path has>.
 *
 * Each record is written under a temporary name before the real call and renamed into place
 * only once it returned 0, so after a SIGKILL at any moment the shadow holds, for every file
 * and directory, what its last completed fsync made durable, and nothing written after the
 * call began. The disk is then rebuilt from it: each directory's last listed names, each
 * with its inode's last saved content (empty when it was never fsynced), which is at most
 * what a real disk would keep (ext4 may keep more, never less). One mutex orders the calls,
 * so a later record is never replaced by an earlier one. The code under test runs unchanged.
 */

#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fault.h"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long counter;

/* The path relative to $EB_POWER_DIR of what `fd` is open on ("" for the directory itself),
 * or NULL when it lies elsewhere. */
static const char *watched(int fd, char *path, size_t size)
{
    const char *top = getenv("EB_POWER_DIR");
    char link[64];
    ssize_t n;
    size_t len;
    if (top == NULL || getenv("EB_POWER_SHADOW") == NULL)
        return NULL;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    n = readlink(link, path, size - 1);
    if (n < 0)
        return NULL;
    path[n] = '\0';
    len = strlen(top);
    if (strncmp(path, top, len) != 0 || (path[len] != '\0' && path[len] != '/'))
        return NULL;
    return path[len] == '/' ? path + len + 1 : path + len;
}

static int key_of(int dirfd, const char *name, int flags, char *key, size_t size, char *type)
{
    struct statx st;
    if (statx(dirfd, name, flags | AT_SYMLINK_NOFOLLOW, STATX_INO | STATX_TYPE | STATX_BTIME,
              &st) != 0)
        return -1;
    snprintf(key, size, "%llu-%lld.%u", (unsigned long long)st.stx_ino,
             (long long)st.stx_btime.tv_sec, st.stx_btime.tv_nsec);
    if (type != NULL)
        *type = S_ISREG(st.stx_mode) ? 'f' : S_ISDIR(st.stx_mode) ? 'd' : 'o';
    return 0;
}

/* Copy the file `fd` is open on into `out` (read through /proc, whatever mode fd has). */
static int save_file(int fd, int out)
{
    char link[64], buf[65536];
    ssize_t n;
    int in;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    in = open(link, O_RDONLY | O_CLOEXEC);
    if (in < 0)
        return -1;
    while ((n = read(in, buf, sizeof buf)) > 0)
        if (write(out, buf, (size_t)n) != n) {
            n = -1;
            break;
        }
    close(in);
    return n < 0 ? -1 : 0;
}

static int save_listing(int fd, int out)
{
    char link[64], key[96], type, line[4096 + 128];
    struct dirent *e;
    DIR *d;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    d = opendir(link);
    if (d == NULL)
        return -1;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (key_of(dirfd(d), e->d_name, 0, key, sizeof key, &type) != 0)
            continue;  /* removed meanwhile */
        int n = snprintf(line, sizeof line, "%c %s %s\n", type, key, e->d_name);
        if (write(out, line, (size_t)n) != n) {
            closedir(d);
            return -1;
        }
    }
    closedir(d);
    return 0;
}

static int sync_call(int fd, int (**real)(int), const char *name)
{
    char path[4096], tmp[4200], final[4200], key[96];
    const char *rel;
    struct stat st;
    int out, rc, saved = 0;
    if (*real == NULL)
        *real = (int (*)(int))dlsym(RTLD_NEXT, name);
    rel = watched(fd, path, sizeof path);
    if (rel == NULL || fstat(fd, &st) != 0 || !(S_ISREG(st.st_mode) || S_ISDIR(st.st_mode)))
        return (*real)(fd);
    const char *shadow = getenv("EB_POWER_SHADOW");
    pthread_mutex_lock(&lock);
    snprintf(tmp, sizeof tmp, "%s/tmp/%d-%lu", shadow, getpid(), ++counter);
    if (S_ISDIR(st.st_mode)) {
        char enc[4096];
        size_t i;
        snprintf(enc, sizeof enc, "%s", *rel ? rel : "/");  /* not ".": a rename to it fails */
        for (i = 0; enc[i]; i++)
            if (enc[i] == '/')
                enc[i] = '%';
        snprintf(final, sizeof final, "%s/dirs/%s", shadow, enc);
    } else {
        if (key_of(fd, "", AT_EMPTY_PATH, key, sizeof key, NULL) != 0)
            goto real;
        snprintf(final, sizeof final, "%s/files/%s", shadow, key);
    }
    out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out >= 0) {
        saved = (S_ISDIR(st.st_mode) ? save_listing(fd, out) : save_file(fd, out)) == 0;
        close(out);
    }
    if (!saved) {
        fprintf(stderr, "powercut shim: cannot save %s in %s: %s\n", path, shadow,
                strerror(errno));
        abort();  /* a record missing would make the rebuilt disk lie */
    }
real:
    rc = (*real)(fd);
    if (saved) {
        if (rc != 0)
            unlink(tmp);
        else if (rename(tmp, final) != 0) {
            fprintf(stderr, "powercut shim: cannot record %s as %s: %s\n", path, final,
                    strerror(errno));
            abort();
        }
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

EB_INTERPOSE_SYNC(sync_call)
