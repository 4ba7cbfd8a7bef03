/*
 * Files of a checkpoint: written under a temporary name, flushed, renamed, and the directory flushed,
 * so that a crash leaves the old file or the new one (POSIX rename(2) replaces atomically; fsync(2) of
 * the file and then of its directory makes data and name durable); read with pread(2), whole or in
 * part. Every failure fills msg with the path and strerror and returns MOE_ERR_IO.
 * Test seam (internal, like moe_fault_host_arm): the n-th read or write from now fails with EIO, or,
 * short = 1, a write stores half of its bytes and then fails with ENOSPC.
 */
#ifndef MOE_CKPT_FILE_IO_H
#define MOE_CKPT_FILE_IO_H

#include <stddef.h>
#include <stdint.h>

typedef struct moe_file_out {
    int fd;
    char *tmp, *path; /* moe_host_malloc'd */
} moe_file_out;

int32_t moe_file_create(moe_file_out *f, const char *path, char *msg, size_t cap);
int32_t moe_file_write(moe_file_out *f, const void *p, size_t n, char *msg, size_t cap);
/* n bytes at offset off (the file's position is not used; safe beside another thread's pwrite). */
int32_t moe_file_pwrite(moe_file_out *f, const void *p, size_t n, uint64_t off, char *msg, size_t cap);
/* fsync, close, rename over path, fsync the directory; the file is closed either way. *renamed = 1 once
 * the rename happened (a failure after it is the directory's flush: the new file is in place). */
int32_t moe_file_commit(moe_file_out *f, int *renamed, char *msg, size_t cap);
/* Closes and removes the temporary file (after a failure). */
void moe_file_abort(moe_file_out *f);

/* Opens for reading; *size = its bytes. */
int32_t moe_file_open(const char *path, int *fd, uint64_t *size, char *msg, size_t cap);
/* Tells the kernel the file is read front to back (a larger readahead). */
void moe_file_sequential(int fd);
int32_t moe_file_pread(int fd, const char *path, void *p, size_t n, uint64_t off, char *msg, size_t cap);
/* Reads a small file (an index) whole, NUL-terminated; *out moe_host_malloc'd. */
int32_t moe_file_read_all(const char *path, size_t max, char **out, size_t *len, char *msg, size_t cap);
/* mkdir of one level when missing. */
int32_t moe_file_mkdir(const char *dir, char *msg, size_t cap);

void moe_fault_io_arm(int64_t n, int short_write);
int moe_fault_io_fired(void);

#endif /* MOE_CKPT_FILE_IO_H */
