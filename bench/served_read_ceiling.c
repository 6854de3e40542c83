// The most a served read can get from this host's disk, with no NVMe/TCP and no file
// system: reader threads `pread` 4 MiB O_DIRECT pieces of a file (each thread its own
// region, sequentially) into buffers on huge pages, as an NSD server's drive reads do, and
// either keep them (`read`: the server's local access) or send each piece over TCP to a
// receiver in another network namespace (`send`: a connection per thread; `share`: the
// threads share CONNS connections, one send at a time on each, as an NSD server's queues
// do). The ratio send / read is the ceiling of "through the server / local" for
// sequential reads on this host, whatever the serving code does.
//
//   cc -O2 -pthread -o /tmp/served_read_ceiling bench/served_read_ceiling.c
//   dd if=/dev/urandom of=/var/tmp/data bs=4M count=1024 oflag=direct   # 4 GiB, allocated
//   ip netns exec NODE2 /tmp/served_read_ceiling recv CONNECTIONS [RING_MIB]  # CONNECTIONS = THREADS for send
//   ip netns exec NODE1 /tmp/served_read_ceiling read|send|share FILE THREADS SECONDS REGION_MIB HOST [CONNS]
//
// RING_MIB makes each receiver write every piece whole into the next 4 MiB buffer of a
// ring of that many MiB (64: larger than the cache), as an NSD client fills a block buffer;
// without it a receiver overwrites the start of one buffer, which stays in the cache.
//
// Prints the MB/s read (and sent); watch `iostat -x` of the disk beside it.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define PIECE (4 << 20)
#define HUGE (2UL << 20)
#define MAX_THREADS 64
#define PORT 5999

static const char *mode, *file, *host;
static int seconds, nconn;
static long long region;
static long long total;
static int shared[MAX_THREADS];
static pthread_mutex_t shared_lock[MAX_THREADS];

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void die(const char *what) {
    perror(what);
    exit(1);
}

// A buffer on transparent huge pages, so one 4 MiB read is one disk request.
static char *huge_buffer(size_t n) {
    char *p = mmap(0, n + HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) die("mmap");
    p = (char *)(((unsigned long)p + HUGE - 1) & ~(HUGE - 1));
    madvise(p, n, MADV_HUGEPAGE);
    memset(p, 0, n);
    return p;
}

static int connect_to(const char *to) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(PORT)};
    if (inet_pton(AF_INET, to, &a.sin_addr) != 1) die("address");
    if (connect(s, (void *)&a, sizeof a)) die("connect");
    return s;
}

static void send_all(int s, const char *b, size_t n) {
    for (size_t done = 0; done < n;) {
        ssize_t w = send(s, b + done, n - done, 0);
        if (w <= 0) die("send");
        done += w;
    }
}

static void *reader(void *arg) {
    long i = (long)arg;
    int fd = open(file, O_RDONLY | O_DIRECT);
    if (fd < 0) die(file);
    char *b = huge_buffer(PIECE);
    int own = !strcmp(mode, "send") ? connect_to(host) : -1;
    int share = !strcmp(mode, "share");
    double end = now() + seconds;
    long long off = 0;
    while (now() < end) {
        if (pread(fd, b, PIECE, i * region + off) != PIECE) die("pread");
        off = (off + PIECE) % region;
        if (own >= 0) send_all(own, b, PIECE);
        if (share) {
            pthread_mutex_lock(&shared_lock[i % nconn]);
            send_all(shared[i % nconn], b, PIECE);
            pthread_mutex_unlock(&shared_lock[i % nconn]);
        }
        __sync_fetch_and_add(&total, PIECE);
    }
    if (own >= 0) close(own);
    close(fd);
    return 0;
}

// Bytes of 4 MiB block buffers each receiver fills in turn; 0: one buffer whose start
// every `recv` overwrites (it stays in the CPU's cache).
static size_t ring_bytes;

// Receives one connection. With a ring, every piece is written whole into the next 4 MiB
// buffer, as an NSD client writes each block into its own buffer (cold in the cache when
// the ring is larger than the cache).
static void *drain(void *arg) {
    int c = (int)(long)arg;
    if (ring_bytes == 0) {
        char *b = huge_buffer(PIECE);
        while (recv(c, b, PIECE, 0) > 0) {
        }
        return 0;
    }
    char *ring = huge_buffer(ring_bytes);
    for (size_t at = 0;; at = (at + PIECE) % ring_bytes) {
        for (size_t got = 0; got < PIECE;) {
            ssize_t r = recv(c, ring + at + got, PIECE - got, 0);
            if (r <= 0) return 0;
            got += r;
        }
    }
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s recv CONNECTIONS [RING_MIB] | %s read|send|share FILE THREADS SECONDS "
                        "REGION_MIB [HOST] [CONNS]\n", argv[0], argv[0]);
        return 2;
    }
    mode = argv[1];
    pthread_t t[MAX_THREADS];
    if (!strcmp(mode, "recv")) {
        int n = atoi(argv[2]), one = 1;
        if (n < 1 || n > MAX_THREADS) die("connections");
        ring_bytes = argc > 3 ? (size_t)atoi(argv[3]) << 20 : 0;
        if (ring_bytes % PIECE) die("the ring is whole 4 MiB buffers");
        int l = socket(AF_INET, SOCK_STREAM, 0);
        setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(PORT)};
        if (bind(l, (void *)&a, sizeof a) || listen(l, MAX_THREADS)) die("listen");
        for (int i = 0; i < n; i++) {
            long c = accept(l, 0, 0);
            if (c < 0) die("accept");
            pthread_create(&t[i], 0, drain, (void *)c);
        }
        for (int i = 0; i < n; i++) pthread_join(t[i], 0);
        return 0;
    }
    if (argc < 6) die("arguments");
    file = argv[2];
    int threads = atoi(argv[3]);
    seconds = atoi(argv[4]);
    region = atoll(argv[5]) << 20;
    host = argc > 6 ? argv[6] : "127.0.0.1";
    nconn = argc > 7 ? atoi(argv[7]) : 2;
    if (threads < 1 || threads > MAX_THREADS || nconn < 1 || nconn > MAX_THREADS) die("threads");
    if (!strcmp(mode, "share")) {
        for (int k = 0; k < nconn; k++) {
            pthread_mutex_init(&shared_lock[k], 0);
            shared[k] = connect_to(host);
        }
    }
    double t0 = now();
    for (long i = 0; i < threads; i++) pthread_create(&t[i], 0, reader, (void *)i);
    for (int i = 0; i < threads; i++) pthread_join(t[i], 0);
    printf("%s, %d threads: %.0f MB/s\n", mode, threads, total / 1e6 / (now() - t0));
    return 0;
}
