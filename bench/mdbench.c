/* Metadata rates from one process, like mdtest's file phases: create (open O_CREAT +
 * close), stat, unlink of N files in one directory. Prints one line per phase:
 *   <phase> <files> <seconds> <files/s>
 * Build: cc -O2 -o mdbench mdbench.c ; run: ./mdbench DIR N */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s DIR N\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1];
    long n = atol(argv[2]);
    char path[4096];
    if (mkdir(dir, 0755) != 0) {
        perror(dir);
        return 1;
    }
    double t0 = now();
    for (long i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/file.%ld", dir, i);
        int fd = open(path, O_CREAT | O_WRONLY | O_EXCL, 0644);
        if (fd < 0 || close(fd) != 0) { perror(path); return 1; }
    }
    double t1 = now();
    struct stat st;
    for (long i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/file.%ld", dir, i);
        if (stat(path, &st) != 0) { perror(path); return 1; }
    }
    double t2 = now();
    for (long i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/file.%ld", dir, i);
        if (unlink(path) != 0) { perror(path); return 1; }
    }
    double t3 = now();
    rmdir(dir);
    printf("create %ld %.3f %.0f\n", n, t1 - t0, n / (t1 - t0));
    printf("stat %ld %.3f %.0f\n", n, t2 - t1, n / (t2 - t1));
    printf("unlink %ld %.3f %.0f\n", n, t3 - t2, n / (t3 - t2));
    return 0;
}
