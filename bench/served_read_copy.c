// What an NSD server's read costs in CPU when it sends a drive's bytes over TCP to a
// receiver on the same host, by three ways of sending (the question: would `splice` from
// the drive to the socket make served reads cheaper on this host?):
//
//   copy           pread(O_DIRECT) into a buffer, then send: the server's way today
//   splice-direct  splice(O_DIRECT drive -> pipe -> socket): no copy on the server
//   splice-cached  splice(page cache -> pipe -> socket): no copy, no drive read either
//
// A child process receives into a 1 MiB buffer and reports its own CPU time, so both the
// sender's and the receiver's cost show.
//
//   cc -O2 -o /tmp/served_read_copy bench/served_read_copy.c
//   /tmp/served_read_copy FILE MODE [CHUNK_BYTES] [TOTAL_BYTES]
//   (FILE: a file of at least CHUNK_BYTES on the drive's file system, e.g. 1 GiB of
//   /dev/urandom; the reads wrap around it)
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static double cpu(struct timeval tv) { return tv.tv_sec + tv.tv_usec / 1e6; }

static void die(const char *what) {
    perror(what);
    exit(1);
}

// Receives until the sender closes; prints its bytes and CPU seconds on one line.
static void receive(struct sockaddr_in *at) {
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (void *)at, sizeof *at) < 0) die("connect");
    char *buf = malloc(1 << 20);
    size_t got = 0;
    ssize_t n;
    while ((n = recv(c, buf, 1 << 20, 0)) > 0) got += n;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("receiver: %zu MiB, user %.3f s, sys %.3f s\n", got >> 20, cpu(ru.ru_utime),
           cpu(ru.ru_stime));
    exit(0);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s FILE copy|splice-direct|splice-cached [CHUNK] [TOTAL]\n",
                argv[0]);
        return 2;
    }
    const char *mode = argv[2];
    int copy = !strcmp(mode, "copy"), cached = !strcmp(mode, "splice-cached");
    if (!copy && !cached && strcmp(mode, "splice-direct")) {
        fprintf(stderr, "unknown mode %s (copy, splice-direct or splice-cached)\n", mode);
        return 2;
    }
    size_t chunk = argc > 3 ? strtoul(argv[3], 0, 0) : 1 << 20;
    size_t total = argc > 4 ? strtoul(argv[4], 0, 0) : (size_t)4 << 30;

    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in at = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof at;
    if (bind(ls, (void *)&at, sizeof at) < 0 || listen(ls, 1) < 0 ||
        getsockname(ls, (void *)&at, &len) < 0)
        die("listen");
    pid_t child = fork();
    if (child == 0) receive(&at);
    int s = accept(ls, 0, 0);
    if (s < 0) die("accept");

    int fd = open(argv[1], cached ? O_RDONLY : O_RDONLY | O_DIRECT);
    if (fd < 0) die(argv[1]);
    off_t size = lseek(fd, 0, SEEK_END);
    if (size < (off_t)chunk) {
        fprintf(stderr, "%s is smaller than one chunk\n", argv[1]);
        return 1;
    }
    void *buf;
    if (posix_memalign(&buf, 4096, chunk)) die("posix_memalign");
    int pipefd[2];
    if (pipe(pipefd) < 0) die("pipe");
    if (!copy && fcntl(pipefd[1], F_SETPIPE_SZ, chunk) < 0) die("F_SETPIPE_SZ");

    double t0 = now();
    off_t off = 0;
    for (size_t sent = 0; sent < total; sent += chunk, off += chunk) {
        if (off + (off_t)chunk > size) off = 0;
        if (copy) {
            if (pread(fd, buf, chunk, off) != (ssize_t)chunk) die("pread");
            for (size_t w = 0; w < chunk;) {
                ssize_t k = send(s, (char *)buf + w, chunk - w, 0);
                if (k < 0) die("send");
                w += k;
            }
            continue;
        }
        loff_t from = off;
        for (size_t in = 0; in < chunk;) {
            ssize_t r = splice(fd, &from, pipefd[1], NULL, chunk - in, SPLICE_F_MOVE);
            if (r <= 0) die("splice from the file");
            in += r;
        }
        for (size_t w = 0; w < chunk;) {
            ssize_t k = splice(pipefd[0], NULL, s, NULL, chunk - w, SPLICE_F_MOVE | SPLICE_F_MORE);
            if (k <= 0) die("splice to the socket");
            w += k;
        }
    }
    close(s);
    double secs = now() - t0;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    fflush(stdout);
    int status;
    waitpid(child, &status, 0);
    printf("%s, %zu KiB pieces: %.0f MB/s; sender: user %.3f s, sys %.3f s\n", mode, chunk >> 10,
           total / 1e6 / secs, cpu(ru.ru_utime), cpu(ru.ru_stime));
    return 0;
}
