#!/usr/bin/env python3
"""NVMe/TCP through Tessera's host against fio's local O_DIRECT, in one run.

    bench/nvme_fio.py [--dir DIR] [--size 1G] [--seconds 5] [--rounds 3] [-- BENCH OPTIONS]

Each round runs, workload by workload, `tessera bench nvme --rounds 1 --only W -Y` (the
file locally with O_DIRECT and through a drive server on loopback) and fio's O_DIRECT jobs
for W on a file of the same size in the same directory, alternating which goes first. Medians over rounds are printed with
two ratios: remote / fio (the local reference every storage engineer knows) and remote /
the benchmark's own local reader. fio uses its default buffers (malloc'd, base pages).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESSERA = os.path.join(ROOT, "target", "release", "tessera")

# (tessera workload name, how fio keeps the queue depth, fio options). The benchmark keeps
# QD4 and QD32 with 4 and 32 threads of one synchronous I/O each (that is how vdisks and
# the file system use a namespace), and fio is run that way too. "rand read 4 KiB, 1
# thread" keeps 32 reads in flight from one thread (io_uring locally, submitted reads
# through the host), as fio does with io_uring at iodepth 32. Random writes are also
# compared with fio's io_uring, though the host has no submitted writes.
WORKLOADS = [
    ("seq write 1 MiB, QD1", "1 job", ["--rw=write", "--bs=1M", "--ioengine=psync", "--numjobs=1"]),
    ("seq read 1 MiB, QD1", "1 job", ["--rw=read", "--bs=1M", "--ioengine=psync", "--numjobs=1"]),
    ("seq write 1 MiB, QD4", "4 jobs", ["--rw=write", "--bs=1M", "--ioengine=psync", "--numjobs=4", "--offset_increment=25%", "--size=25%"]),
    ("seq read 1 MiB, QD4", "4 jobs", ["--rw=read", "--bs=1M", "--ioengine=psync", "--numjobs=4", "--offset_increment=25%", "--size=25%"]),
    ("rand read 4 KiB", "32 jobs", ["--rw=randread", "--bs=4k", "--ioengine=psync", "--numjobs=32"]),
    ("rand read 4 KiB, 1 thread", "io_uring QD32", ["--rw=randread", "--bs=4k", "--ioengine=io_uring", "--iodepth=32", "--numjobs=1"]),
    ("rand write 4 KiB", "32 jobs", ["--rw=randwrite", "--bs=4k", "--ioengine=psync", "--numjobs=32"]),
    ("rand write 4 KiB", "io_uring QD32", ["--rw=randwrite", "--bs=4k", "--ioengine=io_uring", "--iodepth=32", "--numjobs=1"]),
]


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    if text[-1].upper() in units:
        return int(text[:-1]) * units[text[-1].upper()]
    return int(text)


def run_tessera(args, extra):
    out = subprocess.run(
        [TESSERA, "bench", "nvme", "--dir", args.dir, "--size", args.size,
         "--seconds", str(args.seconds), "--rounds", "1", "-Y"] + extra,
        check=True, capture_output=True, text=True).stdout
    header, rows = None, {}
    for line in out.splitlines():
        f = line.split(":")
        if len(f) < 3 or f[0] != "bench":
            continue
        if f[2] == "HEADER":
            header = f[6:-1]
        elif header:
            rec = dict(zip(header, [v.replace("%3A", ":").replace("%25", "%") for v in f[6:-1]]))
            rows[rec["workload"]] = rec
    return rows


def run_fio(args, path, opts):
    out = subprocess.run(
        ["fio", "--name=local", f"--filename={path}", "--direct=1", f"--size={args.size}",
         "--time_based", f"--runtime={args.seconds}", "--group_reporting",
         "--output-format=json"] + opts,
        check=True, capture_output=True, text=True).stdout
    job = json.loads(out[out.index("{"):])["jobs"][0]
    side = job["write"] if job["write"]["io_bytes"] > 0 else job["read"]
    pct = side["clat_ns"].get("percentile", {})
    return {
        "mbps": side["bw_bytes"] / 1e6,
        "iops": side["iops"],
        "p50": pct.get("50.000000", 0) / 1000,
        "p99": pct.get("99.000000", 0) / 1000,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", default="/var/tmp/tessera-nvme-bench")
    p.add_argument("--size", default="1G")
    p.add_argument("--seconds", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("extra", nargs="*", help="options for tessera bench nvme")
    args = p.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    fio_file = os.path.join(args.dir, "fio-local.dat")
    # fio lays the file out once; every round reuses it.
    subprocess.run(["fio", "--name=prep", f"--filename={fio_file}", f"--size={args.size}",
                    "--rw=write", "--bs=1M", "--direct=1", "--output-format=terse"],
                   check=True, capture_output=True)
    fio = {(w, how): [] for w, how, _ in WORKLOADS}
    tess = {w: [] for w, _, _ in WORKLOADS}
    names = list(tess)
    try:
        # Workload by workload, so fio and the benchmark measure the same minutes of a
        # disk whose speed moves by 2x within minutes; which goes first alternates.
        for r in range(args.rounds):
            for k, name in enumerate(names):
                order = ["fio", "tessera"] if (r + k) % 2 == 0 else ["tessera", "fio"]
                for who in order:
                    if who == "fio":
                        for w, how, opts in WORKLOADS:
                            if w == name:
                                fio[(w, how)].append(run_fio(args, fio_file, opts))
                    else:
                        rows = run_tessera(args, ["--only", name] + args.extra)
                        tess[name].append(rows[name])
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    finally:
        os.unlink(fio_file)

    def med(values):
        return statistics.median(values)

    cols = ["workload", "fio QD by", "fio local MB/s", "bench local MB/s", "NVMe/TCP MB/s",
            "NVMe/TCP / fio", "NVMe/TCP / local", "fio p50/p99 µs", "NVMe/TCP p50/p99 µs"]
    table = []
    for name, how, _ in WORKLOADS:
        f = fio[(name, how)]
        t = tess[name]
        fio_mb = med([x["mbps"] for x in f])
        loc_mb = med([float(x["localMBps"]) for x in t])
        rem_mb = med([float(x["remoteMBps"]) for x in t])
        ratios_fio = sorted(float(x["remoteMBps"]) / y["mbps"] for x, y in zip(t, f))
        table.append([
            name,
            how,
            f"{fio_mb:.1f}",
            f"{loc_mb:.1f}",
            f"{rem_mb:.1f}",
            f"{rem_mb / fio_mb:.2f} ({ratios_fio[0]:.2f}-{ratios_fio[-1]:.2f})",
            f"{rem_mb / loc_mb:.2f}",
            f"{med([x['p50'] for x in f]):.0f}/{med([x['p99'] for x in f]):.0f}",
            f"{med([float(x['remoteP50Us']) for x in t]):.0f}/{med([float(x['remoteP99Us']) for x in t]):.0f}",
        ])
    widths = [max(len(c), *(len(row[i]) for row in table)) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cols, widths))))
    print("  ".join("-" * w for w in widths))
    for row in table:
        print("  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths))))
    print(f"\n{args.rounds} rounds of {args.seconds} s per workload, file {args.size} in {args.dir}; "
          "medians, (range of the per-round ratio)")


if __name__ == "__main__":
    main()
