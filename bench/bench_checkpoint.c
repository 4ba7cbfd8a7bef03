/*
 * Checkpoint save and load against the disk's own speed, in one run: moe_layer_save of a large layer
 * (snapshot, CRC-32 of every tensor, write, fsync, rename, index) against a plain write + fsync of the
 * same number of bytes, and moe_layer_load (index, headers, read, CRC-32, copy into the layer) against
 * a plain read of the same file. Before each read (the engine's and the plain one) the page cache is
 * dropped (/proc/sys/vm/drop_caches, as root) so that both read from the disk; where that is not
 * allowed both read warm, and the table says which. Prints medians over --reps runs, MB/s, ratios.
 *
 *   bench_checkpoint [--experts E] [--hidden H] [--ffn F] [--reps N] [--dir DIR]
 */
#define _DEFAULT_SOURCE /* sync(2) */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "moe.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double plain_write(const char *path, const char *buf, size_t bytes)
{
    const double t0 = now();
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return -1;
    for (size_t at = 0; at < bytes;) {
        const ssize_t w = write(fd, buf + at, bytes - at > (1u << 26) ? (1u << 26) : bytes - at);
        if (w <= 0) return -1;
        at += (size_t)w;
    }
    if (fsync(fd) != 0) return -1;
    close(fd);
    return now() - t0;
}

static double plain_read(const char *path, char *buf, size_t bytes)
{
    const double t0 = now();
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    for (size_t at = 0; at < bytes;) {
        const ssize_t r = pread(fd, buf + at, bytes - at > (1u << 26) ? (1u << 26) : bytes - at, (off_t)at);
        if (r <= 0) return -1;
        at += (size_t)r;
    }
    close(fd);
    return now() - t0;
}

/* Drops the page cache; 1 when it could. */
static int drop_caches(void)
{
    sync();
    FILE *f = fopen("/proc/sys/vm/drop_caches", "w");
    if (!f) return 0;
    const int ok = fputs("3\n", f) >= 0;
    return fclose(f) == 0 && ok;
}

static int64_t file_bytes(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "du -sb --apparent-size %s", dir);
    FILE *p = popen(cmd, "r");
    long long n = 0;
    if (!p || fscanf(p, "%lld", &n) != 1) n = 0;
    if (p) pclose(p);
    return n;
}

int main(int argc, char **argv)
{
    int64_t E = 32, H = 1024, F = 1024;
    int reps = 3;
    const char *base = "/tmp";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--experts")) E = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--hidden")) H = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--ffn")) F = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--dir")) base = argv[i + 1];
        else {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (reps < 1 || reps > 50) reps = 3;
    char dir[512], plain[600];
    snprintf(dir, sizeof dir, "%s/moe_bench_ckpt_%d", base, (int)getpid());
    snprintf(plain, sizeof plain, "%s.plain", dir);

    moe_context_config cc;
    moe_context_config_init(&cc, sizeof cc);
    moe_context *ctx = NULL;
    moe_layer_config c;
    moe_layer_config_init(&c, sizeof c);
    c.hidden_size = H, c.ffn_hidden_size = F, c.num_experts = (int32_t)E, c.top_k = 2;
    c.activation = MOE_ACT_SWIGLU;
    c.param_dtype = MOE_DTYPE_FP32;
    moe_layer *layer = NULL;
    if (moe_context_create(&cc, &ctx) || moe_layer_create(ctx, &c, &layer)) {
        fprintf(stderr, "bench_checkpoint: could not create the layer\n");
        return 1;
    }
    moe_checkpoint_config k;
    moe_checkpoint_config_init(&k, sizeof k);
    k.dir = dir;
    double ts[50], tl[50], tw[50], tr[50];
    size_t bytes = 0;
    char *buf = NULL;
    int cold = 1;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        if (moe_layer_save(layer, &k) != MOE_OK) {
            char m[512];
            moe_context_last_error(ctx, m, sizeof m);
            fprintf(stderr, "save: %s\n", m);
            return 1;
        }
        ts[r] = now() - t0;
        if (!buf) {
            bytes = (size_t)file_bytes(dir);
            buf = malloc(bytes);
            for (size_t i = 0; i < bytes; i++) buf[i] = (char)(i * 131);
        }
        tw[r] = plain_write(plain, buf, bytes);
        cold &= drop_caches();
        t0 = now();
        if (moe_layer_load(layer, &k) != MOE_OK) {
            char m[512];
            moe_context_last_error(ctx, m, sizeof m);
            fprintf(stderr, "load: %s\n", m);
            return 1;
        }
        tl[r] = now() - t0;
        cold &= drop_caches();
        tr[r] = plain_read(plain, buf, bytes);
        if (tw[r] < 0 || tr[r] < 0) {
            fprintf(stderr, "bench_checkpoint: the plain write or read of %s failed\n", plain);
            return 1;
        }
    }
    const double mb = (double)bytes / 1e6, s = median(ts, reps), l = median(tl, reps), w = median(tw, reps),
                 rd = median(tr, reps);
    printf("checkpoint: E=%lld H=%lld F=%lld fp32, %.1f MB on %s, median of %d\n", (long long)E, (long long)H,
           (long long)F, mb, base, reps);
    printf("| | engine ms | plain ms | engine MB/s | plain MB/s | engine / plain speed |\n|---|--:|--:|--:|--:|--:|\n");
    printf("| save vs write+fsync | %.0f | %.0f | %.0f | %.0f | %.2f |\n", 1e3 * s, 1e3 * w, mb / s, mb / w, w / s);
    printf("| load vs read (%s) | %.0f | %.0f | %.0f | %.0f | %.2f |\n", cold ? "cold cache" : "warm cache", 1e3 * l, 1e3 * rd, mb / l, mb / rd, rd / l);
    char cmd[1300];
    snprintf(cmd, sizeof cmd, "rm -rf %s %s", dir, plain);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    free(buf);
    moe_layer_destroy(layer);
    moe_context_destroy(ctx);
    return 0;
}
