/*
 * Reference erasure-coding throughput of the system ISA-L, measured the way
 * `tessera bench ec` measures Tessera: one thread, GB/s = data bytes (k x strip) per
 * second (1e9 bytes), decode = rebuild the first m DATA strips from the first k survivors.
 *
 * The decode tables are built once, outside the timed loop (as a decoder caching them per
 * erasure pattern would), so the number is the kernel's best case.
 *
 * Build: cc -O2 -o isal_bench isal_bench.c -lisal
 * Usage: isal_bench K M STRIP_BYTES SECONDS
 * Prints: bench_ec_ref:isa-l:K+Mp:STRIP_BYTES:ENCODE_GBPS:DECODE_GBPS:
 */
#include <isa-l/erasure_code.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_STRIPS 32

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static unsigned char *strip_alloc(size_t len, unsigned seed)
{
	unsigned char *p;
	if (posix_memalign((void **)&p, 64, len ? len : 64)) {
		perror("posix_memalign");
		exit(1);
	}
	unsigned x = seed * 2654435761u | 1;
	for (size_t i = 0; i < len; i++) {
		x ^= x << 13;
		x ^= x >> 17;
		x ^= x << 5;
		p[i] = (unsigned char)x;
	}
	return p;
}

int main(int argc, char **argv)
{
	if (argc != 5) {
		fprintf(stderr, "usage: %s K M STRIP_BYTES SECONDS\n", argv[0]);
		return 2;
	}
	int k = atoi(argv[1]), m = atoi(argv[2]);
	size_t len = strtoull(argv[3], NULL, 10);
	double seconds = atof(argv[4]);
	if (k < 1 || m < 1 || k + m > MAX_STRIPS || m > k) {
		fprintf(stderr, "need 1 <= M <= K and K+M <= %d\n", MAX_STRIPS);
		return 2;
	}

	unsigned char *strips[MAX_STRIPS];
	for (int i = 0; i < k + m; i++)
		strips[i] = strip_alloc(len, i + 1);

	/* Cauchy matrix: every k x k submatrix is invertible, so any erasure pattern decodes. */
	unsigned char a[MAX_STRIPS * MAX_STRIPS];
	unsigned char *enc_tbls = malloc(32 * k * m);
	gf_gen_cauchy1_matrix(a, k + m, k);
	ec_init_tables(k, m, &a[k * k], enc_tbls);

	/* Encode. */
	ec_encode_data(len, k, m, enc_tbls, strips, &strips[k]);
	double t0 = now(), t;
	long ops = 0;
	do {
		ec_encode_data(len, k, m, enc_tbls, strips, &strips[k]);
		ops++;
	} while ((t = now()) - t0 < seconds);
	double enc_gbps = (double)k * len * ops / (t - t0) / 1e9;

	/* Decode: lose data strips 0..m-1; survivors are data m..k-1 then parity 0..m-1. */
	unsigned char *expect[MAX_STRIPS], *survivors[MAX_STRIPS], *rebuilt[MAX_STRIPS];
	unsigned char b[MAX_STRIPS * MAX_STRIPS], inv[MAX_STRIPS * MAX_STRIPS];
	unsigned char dec[MAX_STRIPS * MAX_STRIPS];
	for (int i = 0; i < m; i++) {
		expect[i] = malloc(len ? len : 1);
		memcpy(expect[i], strips[i], len);
		rebuilt[i] = strips[i];
	}
	for (int r = 0; r < k; r++) {
		int row = m + r; /* survivor rows in index order */
		memcpy(&b[r * k], &a[row * k], k);
		survivors[r] = strips[row];
	}
	if (gf_invert_matrix(b, inv, k) < 0) {
		fprintf(stderr, "survivor matrix is singular\n");
		return 1;
	}
	for (int i = 0; i < m; i++)
		memcpy(&dec[i * k], &inv[i * k], k); /* lost strip i is data row i */
	unsigned char *dec_tbls = malloc(32 * k * m);
	ec_init_tables(k, m, dec, dec_tbls);
	for (int i = 0; i < m; i++)
		memset(strips[i], 0, len);
	ec_encode_data(len, k, m, dec_tbls, survivors, rebuilt);
	t0 = now();
	ops = 0;
	do {
		ec_encode_data(len, k, m, dec_tbls, survivors, rebuilt);
		ops++;
	} while ((t = now()) - t0 < seconds);
	double dec_gbps = (double)k * len * ops / (t - t0) / 1e9;
	for (int i = 0; i < m; i++) {
		if (memcmp(expect[i], strips[i], len)) {
			fprintf(stderr, "decode did not restore strip %d\n", i);
			return 1;
		}
	}
	printf("bench_ec_ref:isa-l:%d+%dp:%zu:%.3f:%.3f:\n", k, m, len, enc_gbps, dec_gbps);
	return 0;
}
