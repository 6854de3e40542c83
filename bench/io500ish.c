/* One rank of IO500's four patterns, small: run RANKS copies at once (ranks 0..RANKS-1),
 * each printing the seconds its part took; the caller adds up the work and divides by the
 * slowest rank's time.
 *
 *   io500ish DIR RANK RANKS ior-easy-write|ior-easy-read MB
 *       file per rank (DIR/easy.RANK), 1 MiB transfers, fsync at the end of the writes
 *   io500ish DIR RANK RANKS ior-hard-write|ior-hard-read SEGMENTS
 *       one shared file (DIR/hard), 47008-byte transfers interleaved by rank: transfer i of
 *       rank r at (i * RANKS + r) * 47008
 *   io500ish DIR RANK RANKS md-easy-create|md-easy-stat|md-easy-remove FILES
 *       empty files in a directory per rank (DIR/mde.RANK)
 *   io500ish DIR RANK RANKS md-hard-create|md-hard-stat|md-hard-remove FILES
 *       3901-byte files, all ranks in one directory (DIR/mdh)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define HARD_XFER 47008
#define MD_HARD_BYTES 3901

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void die(const char *what, const char *path) {
    fprintf(stderr, "io500ish: %s %s: %s\n", what, path, strerror(errno));
    exit(1);
}

static void full_write(int fd, const char *buf, size_t len, off_t at, const char *path) {
    ssize_t n = pwrite(fd, buf, len, at);
    if (n != (ssize_t)len) die("write", path);
}

static void full_read(int fd, char *buf, size_t len, off_t at, const char *path) {
    ssize_t n = pread(fd, buf, len, at);
    if (n != (ssize_t)len) die("read", path);
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: io500ish DIR RANK RANKS PHASE COUNT\n");
        return 2;
    }
    const char *dir = argv[1];
    long rank = atol(argv[2]), ranks = atol(argv[3]), count = atol(argv[5]);
    const char *phase = argv[4];
    char path[4096];
    static char buf[1 << 20];
    memset(buf, 'a' + (int)(rank % 26), sizeof buf);
    double start = now();
    if (!strncmp(phase, "ior-easy", 8)) {
        snprintf(path, sizeof path, "%s/easy.%ld", dir, rank);
        int writing = !strcmp(phase, "ior-easy-write");
        int fd = open(path, writing ? O_WRONLY | O_CREAT | O_TRUNC : O_RDONLY, 0644);
        if (fd < 0) die("open", path);
        for (long i = 0; i < count; i++) {
            if (writing)
                full_write(fd, buf, sizeof buf, (off_t)i << 20, path);
            else
                full_read(fd, buf, sizeof buf, (off_t)i << 20, path);
        }
        if (writing && fsync(fd)) die("fsync", path);
        close(fd);
    } else if (!strncmp(phase, "ior-hard", 8)) {
        snprintf(path, sizeof path, "%s/hard", dir);
        int writing = !strcmp(phase, "ior-hard-write");
        int fd = open(path, writing ? O_WRONLY | O_CREAT : O_RDONLY, 0644);
        if (fd < 0) die("open", path);
        for (long i = 0; i < count; i++) {
            off_t at = (off_t)(i * ranks + rank) * HARD_XFER;
            if (writing)
                full_write(fd, buf, HARD_XFER, at, path);
            else
                full_read(fd, buf, HARD_XFER, at, path);
        }
        if (writing && fsync(fd)) die("fsync", path);
        close(fd);
    } else if (!strncmp(phase, "md-", 3)) {
        int hard = !strncmp(phase, "md-hard", 7);
        const char *op = phase + 8;
        char sub[2048];
        if (hard)
            snprintf(sub, sizeof sub, "%s/mdh", dir);
        else
            snprintf(sub, sizeof sub, "%s/mde.%ld", dir, rank);
        if (!strcmp(op, "create") && mkdir(sub, 0755) && errno != EEXIST) die("mkdir", sub);
        for (long i = 0; i < count; i++) {
            snprintf(path, sizeof path, "%s/f.%ld.%ld", sub, rank, i);
            if (!strcmp(op, "create")) {
                int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
                if (fd < 0) die("create", path);
                if (hard) full_write(fd, buf, MD_HARD_BYTES, 0, path);
                close(fd);
            } else if (!strcmp(op, "stat")) {
                struct stat st;
                if (stat(path, &st)) die("stat", path);
            } else if (!strcmp(op, "remove")) {
                if (unlink(path)) die("unlink", path);
            } else {
                fprintf(stderr, "io500ish: unknown phase %s\n", phase);
                return 2;
            }
        }
    } else {
        fprintf(stderr, "io500ish: unknown phase %s\n", phase);
        return 2;
    }
    printf("%.6f\n", now() - start);
    return 0;
}
