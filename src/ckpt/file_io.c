/* Checkpoint files (file_io.h). */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/host_alloc.h"
#include "ckpt/file_io.h"
#include "moe.h"

static atomic_llong fault_countdown; /* 0 = disarmed */
static atomic_int fault_short, fault_fired;

void moe_fault_io_arm(int64_t n, int short_write)
{
    atomic_store(&fault_short, short_write);
    atomic_store(&fault_fired, 0);
    atomic_store(&fault_countdown, n > 0 ? n : 0);
}

int moe_fault_io_fired(void) { return atomic_load(&fault_fired); }

/* 1 when this I/O call is the armed one. */
static int fault_now(void)
{
    if (atomic_load_explicit(&fault_countdown, memory_order_relaxed) == 0) return 0;
    if (atomic_fetch_sub(&fault_countdown, 1) != 1) return 0;
    atomic_store(&fault_fired, 1);
    return 1;
}

static int32_t io_error(char *msg, size_t cap, const char *what, const char *path, int err)
{
    snprintf(msg, cap, "%s %s: %s", what, path, strerror(err));
    return MOE_ERR_IO;
}

static char *dup_str(const char *s)
{
    char *d = moe_host_malloc(strlen(s) + 1);
    if (d) strcpy(d, s);
    return d;
}

int32_t moe_file_create(moe_file_out *f, const char *path, char *msg, size_t cap)
{
    *f = (moe_file_out){.fd = -1};
    const size_t n = strlen(path) + 32;
    f->path = dup_str(path);
    f->tmp = moe_host_malloc(n);
    if (!f->path || !f->tmp) {
        moe_host_free(f->tmp), f->tmp = NULL; /* nothing was created: nothing to remove */
        moe_file_abort(f);
        snprintf(msg, cap, "out of memory");
        return MOE_ERR_OUT_OF_MEMORY;
    }
    snprintf(f->tmp, n, "%s.tmp%ld", path, (long)getpid());
    f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f->fd < 0) {
        const int err = errno;
        int32_t rc = io_error(msg, cap, "cannot create", f->tmp, err);
        moe_host_free(f->tmp), f->tmp = NULL; /* nothing to remove */
        moe_file_abort(f);
        return rc;
    }
    return MOE_OK;
}

int32_t moe_file_write(moe_file_out *f, const void *p, size_t n, char *msg, size_t cap)
{
    const char *c = p;
    while (n > 0) {
        size_t chunk = n > ((size_t)1 << 30) ? (size_t)1 << 30 : n;
        ssize_t w;
        if (fault_now()) {
            if (atomic_load(&fault_short) && chunk > 1) (void)!write(f->fd, c, chunk / 2);
            errno = atomic_load(&fault_short) ? ENOSPC : EIO;
            w = -1;
        } else {
            w = write(f->fd, c, chunk);
        }
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return io_error(msg, cap, "cannot write", f->tmp, w < 0 ? errno : ENOSPC);
        c += w, n -= (size_t)w; /* a short write: write the rest */
    }
    return MOE_OK;
}

int32_t moe_file_pwrite(moe_file_out *f, const void *p, size_t n, uint64_t off, char *msg, size_t cap)
{
    const char *c = p;
    while (n > 0) {
        size_t chunk = n > ((size_t)1 << 30) ? (size_t)1 << 30 : n;
        ssize_t w;
        if (fault_now()) {
            if (atomic_load(&fault_short) && chunk > 1) (void)!pwrite(f->fd, c, chunk / 2, (off_t)off);
            errno = atomic_load(&fault_short) ? ENOSPC : EIO;
            w = -1;
        } else {
            w = pwrite(f->fd, c, chunk, (off_t)off);
        }
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return io_error(msg, cap, "cannot write", f->tmp, w < 0 ? errno : ENOSPC);
        c += w, n -= (size_t)w, off += (uint64_t)w;
    }
    return MOE_OK;
}

int32_t moe_file_commit(moe_file_out *f, int *renamed, char *msg, size_t cap)
{
    *renamed = 0;
    int32_t rc = MOE_OK;
    char *dir = dup_str(f->path); /* before the rename: after it, nothing may fail but the flush */
    if (!dir) {
        snprintf(msg, cap, "out of memory");
        moe_file_abort(f);
        return MOE_ERR_OUT_OF_MEMORY;
    }
    if (fsync(f->fd) != 0) rc = io_error(msg, cap, "cannot flush", f->tmp, errno);
    if (close(f->fd) != 0 && rc == MOE_OK) rc = io_error(msg, cap, "cannot close", f->tmp, errno);
    f->fd = -1;
    if (rc == MOE_OK && rename(f->tmp, f->path) != 0) rc = io_error(msg, cap, "cannot rename into", f->path, errno);
    if (rc == MOE_OK) {
        *renamed = 1;
        moe_host_free(f->tmp), f->tmp = NULL; /* nothing left to remove */
        const char *d = dirname(dir);
        int fd = open(d, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0 || fsync(fd) != 0) rc = io_error(msg, cap, "cannot flush directory", d, errno);
        if (fd >= 0) close(fd);
    }
    moe_host_free(dir);
    moe_file_abort(f);
    return rc;
}

void moe_file_abort(moe_file_out *f)
{
    if (f->fd >= 0) close(f->fd);
    if (f->tmp) unlink(f->tmp);
    moe_host_free(f->tmp);
    moe_host_free(f->path);
    *f = (moe_file_out){.fd = -1};
}

int32_t moe_file_open(const char *path, int *fd, uint64_t *size, char *msg, size_t cap)
{
    struct stat st;
    *fd = open(path, O_RDONLY | O_CLOEXEC);
    if (*fd < 0) return io_error(msg, cap, "cannot open", path, errno);
    if (fstat(*fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        const int err = errno;
        close(*fd), *fd = -1;
        return io_error(msg, cap, "cannot read", path, S_ISREG(st.st_mode) ? err : EISDIR);
    }
    *size = (uint64_t)st.st_size;
    return MOE_OK;
}

void moe_file_sequential(int fd) { (void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL); }

int32_t moe_file_pread(int fd, const char *path, void *p, size_t n, uint64_t off, char *msg, size_t cap)
{
    char *c = p;
    while (n > 0) {
        size_t chunk = n > ((size_t)1 << 30) ? (size_t)1 << 30 : n;
        ssize_t r;
        if (fault_now()) errno = EIO, r = -1;
        else r = pread(fd, c, chunk, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return io_error(msg, cap, "cannot read", path, errno);
        if (r == 0) {
            snprintf(msg, cap, "%s ends before byte %llu: truncated", path, (unsigned long long)(off + n));
            return MOE_ERR_IO;
        }
        c += r, n -= (size_t)r, off += (uint64_t)r;
    }
    return MOE_OK;
}

int32_t moe_file_read_all(const char *path, size_t max, char **out, size_t *len, char *msg, size_t cap)
{
    int fd;
    uint64_t size;
    int32_t rc = moe_file_open(path, &fd, &size, msg, cap);
    if (rc) return rc;
    if (size > max) {
        close(fd);
        snprintf(msg, cap, "%s holds %llu bytes, more than the %zu it may", path, (unsigned long long)size, max);
        return MOE_ERR_IO;
    }
    char *buf = moe_host_malloc((size_t)size + 1);
    if (!buf) {
        close(fd);
        snprintf(msg, cap, "out of memory");
        return MOE_ERR_OUT_OF_MEMORY;
    }
    rc = moe_file_pread(fd, path, buf, (size_t)size, 0, msg, cap);
    close(fd);
    if (rc) {
        moe_host_free(buf);
        return rc;
    }
    buf[size] = '\0';
    *out = buf, *len = (size_t)size;
    return MOE_OK;
}

int32_t moe_file_mkdir(const char *dir, char *msg, size_t cap)
{
    if (mkdir(dir, 0755) == 0 || errno == EEXIST) {
        struct stat st;
        if (stat(dir, &st) == 0 && S_ISDIR(st.st_mode)) return MOE_OK;
        return io_error(msg, cap, "not a directory:", dir, ENOTDIR);
    }
    return io_error(msg, cap, "cannot create directory", dir, errno);
}
