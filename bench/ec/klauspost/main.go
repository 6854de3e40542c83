// Reference erasure-coding throughput of klauspost/reedsolomon, measured the way
// `tessera bench ec` measures Tessera: one goroutine on one core, GB/s = data bytes
// (k x strip) per second (1e9 bytes), decode = ReconstructData with the first m DATA
// shards lost.
//
// Usage: go run . K M STRIP_BYTES SECONDS
// Prints: bench_ec_ref:klauspost:K+Mp:STRIP_BYTES:ENCODE_GBPS:DECODE_GBPS:
package main

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"time"

	"github.com/klauspost/reedsolomon"
)

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "klauspost bench:", err)
		os.Exit(1)
	}
}

func arg(i int) int {
	v, err := strconv.Atoi(os.Args[i])
	must(err)
	return v
}

func main() {
	if len(os.Args) != 5 {
		fmt.Fprintln(os.Stderr, "usage: klauspost-bench K M STRIP_BYTES SECONDS")
		os.Exit(2)
	}
	runtime.GOMAXPROCS(1)
	k, m, size := arg(1), arg(2), arg(3)
	seconds, err := strconv.ParseFloat(os.Args[4], 64)
	must(err)
	budget := time.Duration(seconds * float64(time.Second))

	// One goroutine, and no splitting of a shard across workers: the measure is one core.
	enc, err := reedsolomon.New(k, m, reedsolomon.WithMaxGoroutines(1))
	must(err)

	shards := make([][]byte, k+m)
	x := uint32(12345)
	for i := range shards {
		shards[i] = make([]byte, size)
		if i < k {
			for j := range shards[i] {
				x ^= x << 13
				x ^= x >> 17
				x ^= x << 5
				shards[i][j] = byte(x)
			}
		}
	}

	must(enc.Encode(shards))
	ops := 0
	start := time.Now()
	var elapsed time.Duration
	for {
		must(enc.Encode(shards))
		ops++
		if elapsed = time.Since(start); elapsed >= budget {
			break
		}
	}
	encGBps := float64(k*size*ops) / elapsed.Seconds() / 1e9

	expect := make([][]byte, m)
	for i := 0; i < m; i++ {
		expect[i] = append([]byte(nil), shards[i]...)
	}
	// Zero-length shards with capacity are rebuilt in place, so no allocation is timed.
	lose := func() {
		for i := 0; i < m; i++ {
			shards[i] = shards[i][:0]
		}
	}
	lose()
	must(enc.ReconstructData(shards))
	ops = 0
	start = time.Now()
	for {
		lose()
		must(enc.ReconstructData(shards))
		ops++
		if elapsed = time.Since(start); elapsed >= budget {
			break
		}
	}
	decGBps := float64(k*size*ops) / elapsed.Seconds() / 1e9
	for i := 0; i < m; i++ {
		if !bytes.Equal(expect[i], shards[i]) {
			fmt.Fprintln(os.Stderr, "klauspost bench: decode did not restore shard", i)
			os.Exit(1)
		}
	}
	fmt.Printf("bench_ec_ref:klauspost:%d+%dp:%d:%.3f:%.3f:\n", k, m, size, encGBps, decGBps)
}
