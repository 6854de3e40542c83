/* Metadata rates from one process, like mdtest's file phases: create (open O_CREAT +
 * close), stat, unlink of N files. Prints one line per phase:
 *   <phase> <files> <seconds> <files/s>
 * Build: cc -O2 -o mdbench mdbench.c
 * Run:   ./mdbench DIR N [DIRS [PHASES]]
 *   DIRS (default 1): with 1 the files are DIR/file.I; with more, file I is
 *   DIR/d.(I % DIRS)/file.I (mdtest's files spread over directories).
 *   PHASES (default create,stat,unlink): the phases to run, so that a caller can remount
 *   between them; create makes DIR (and the subdirectories), unlink removes them.
 * Environment:
 *   MDBENCH_FILE_BYTES=B  create writes B bytes into each file (default 0: empty files)
 *   MDBENCH_SYNC=1        create and unlink end, inside their timing, with a write and
 *                         fsync of DIR.sync: on a journaled file system that commits
 *                         everything the phase changed (and for unlink, the work the
 *                         deletes leave for after their commit, such as TRIM). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* Writes and fsyncs DIR.sync, then removes it. */
static int sync_marker(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s.sync", dir);
    int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    if (fd < 0 || write(fd, "s", 1) != 1 || fsync(fd) != 0 || close(fd) != 0) {
        perror(path);
        return -1;
    }
    unlink(path);
    return 0;
}

static void path_of(char *out, size_t size, const char *dir, long dirs, long i) {
    if (dirs <= 1)
        snprintf(out, size, "%s/file.%ld", dir, i);
    else
        snprintf(out, size, "%s/d.%ld/file.%ld", dir, i % dirs, i);
}

int main(int argc, char **argv) {
    if (argc < 3 || argc > 5) {
        fprintf(stderr, "usage: %s DIR N [DIRS [PHASES]]\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1];
    long n = atol(argv[2]);
    long dirs = argc > 3 ? atol(argv[3]) : 1;
    const char *phases = argc > 4 ? argv[4] : "create,stat,unlink";
    const char *fb = getenv("MDBENCH_FILE_BYTES");
    long file_bytes = fb ? atol(fb) : 0;
    const char *sy = getenv("MDBENCH_SYNC");
    int sync_after = sy && strcmp(sy, "1") == 0;
    char *content = NULL;
    if (file_bytes > 0) {
        content = malloc(file_bytes);
        if (!content)
            return 1;
        for (long i = 0; i < file_bytes; i++)
            content[i] = (char)(i * 31 % 251 + 1);
    }
    char path[4096];
    if (n < 0 || dirs < 1) {
        fprintf(stderr, "N must be >= 0 and DIRS >= 1\n");
        return 2;
    }
    if (strstr(phases, "create")) {
        if (mkdir(dir, 0755) != 0) {
            perror(dir);
            return 1;
        }
        for (long d = 0; dirs > 1 && d < dirs; d++) {
            snprintf(path, sizeof path, "%s/d.%ld", dir, d);
            if (mkdir(path, 0755) != 0) {
                perror(path);
                return 1;
            }
        }
        double t0 = now();
        for (long i = 0; i < n; i++) {
            path_of(path, sizeof path, dir, dirs, i);
            int fd = open(path, O_CREAT | O_WRONLY | O_EXCL, 0644);
            if (fd < 0) {
                perror(path);
                return 1;
            }
            for (long done = 0; done < file_bytes;) {
                ssize_t w = write(fd, content + done, file_bytes - done);
                if (w <= 0) {
                    perror(path);
                    return 1;
                }
                done += w;
            }
            if (close(fd) != 0) {
                perror(path);
                return 1;
            }
        }
        if (sync_after && sync_marker(dir) != 0)
            return 1;
        double t = now() - t0;
        printf("create %ld %.3f %.0f\n", n, t, n / t);
        fflush(stdout);
    }
    if (strstr(phases, "stat")) {
        struct stat st;
        double t0 = now();
        for (long i = 0; i < n; i++) {
            path_of(path, sizeof path, dir, dirs, i);
            if (stat(path, &st) != 0) {
                perror(path);
                return 1;
            }
        }
        double t = now() - t0;
        printf("stat %ld %.3f %.0f\n", n, t, n / t);
        fflush(stdout);
    }
    if (strstr(phases, "unlink")) {
        double t0 = now();
        for (long i = 0; i < n; i++) {
            path_of(path, sizeof path, dir, dirs, i);
            if (unlink(path) != 0) {
                perror(path);
                return 1;
            }
        }
        if (sync_after && sync_marker(dir) != 0)
            return 1;
        double t = now() - t0;
        for (long d = 0; dirs > 1 && d < dirs; d++) {
            snprintf(path, sizeof path, "%s/d.%ld", dir, d);
            rmdir(path);
        }
        rmdir(dir);
        printf("unlink %ld %.3f %.0f\n", n, t, n / t);
    }
    return 0;
}
