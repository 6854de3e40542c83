// Memory traffic without I/O: copies one buffer of MIB mebibytes into another, over and
// over, for SECONDS, and prints the rate. Run two of these beside a local read of the
// drive to see what copying costs the drive on this host: with 64 MiB buffers every copy
// goes through DRAM, with 0.25 MiB it stays in the CPU's cache and only keeps the CPU
// busy. On a virtual machine whose disk is emulated by the host (its data copied into the
// guest's memory), the first slows the drive and the second does not; an NSD server's
// copies of every byte into the socket, and the client's out of it, are DRAM traffic of
// the first kind (bench/RESULTS.md, "what copying costs this host's disk").
//
//   cc -O2 -o /tmp/memory_traffic bench/memory_traffic.c
//   /tmp/memory_traffic SECONDS MIB
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc != 3 || atof(argv[1]) <= 0 || atof(argv[2]) <= 0) {
        fprintf(stderr, "usage: %s SECONDS MIB (MIB may be a fraction: 0.25)\n", argv[0]);
        return 2;
    }
    double seconds = atof(argv[1]);
    size_t len = (size_t)(atof(argv[2]) * (1 << 20));
    unsigned char *from = malloc(len), *to = malloc(len);
    if (from == NULL || to == NULL) {
        fprintf(stderr, "cannot allocate two buffers of %zu bytes\n", len);
        return 1;
    }
    memset(from, 1, len);
    memset(to, 2, len);
    double start = now(), elapsed;
    unsigned long long copies = 0;
    unsigned checksum = 0;
    do {
        for (int i = 0; i < 16; i++) {
            // A changed source byte and a byte read back from every copy keep the compiler
            // from dropping copies it could prove repeated.
            from[(copies * 4096) % len]++;
            memcpy(to, from, len);
            checksum += to[(copies * 4096) % len];
            copies++;
        }
        elapsed = now() - start;
    } while (elapsed < seconds);
    printf("copied %.1f GB/s with %.2f MiB buffers (checksum %u)\n",
           copies * (double)len / elapsed / 1e9, len / 1048576.0, checksum);
    return 0;
}
