//! The node daemon's Prometheus endpoint (`metricsAddress`): off by default; once set,
//! `/metrics` serves text that a Prometheus parser reads and whose counters move with what
//! a workload did through the FUSE mount; other paths get a JSON 404; a port already in
//! use stops `startup` with an error that names the parameter. `tessera diag --iohist`
//! lists the same disk I/Os one by one.

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};

use common::*;

const MIB: u64 = 1 << 20;

fn get(addr: &str, path: &str) -> (u16, String, String) {
    http_get(addr, path)
}

/// The samples of one scrape, parsed by a Prometheus text parser, by name and labels.
struct Scrape {
    samples: Vec<prometheus_parse::Sample>,
    text: String,
}

impl Scrape {
    fn take(addr: &str) -> Scrape {
        let (status, head, text) = get(addr, "/metrics");
        assert_eq!(status, 200, "{head}\n{text}");
        assert!(
            head.to_ascii_lowercase()
                .contains("content-type: application/openmetrics-text"),
            "{head}"
        );
        assert!(
            text.ends_with("# EOF\n"),
            "OpenMetrics ends with # EOF:\n{text}"
        );
        let lines = text.lines().map(|l| Ok(l.to_string()));
        let scrape = prometheus_parse::Scrape::parse(lines).expect("parses as Prometheus text");
        Scrape {
            samples: scrape.samples,
            text,
        }
    }

    /// The value of the sample `name` whose labels include `labels`; panics if none.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.values(name, labels)
            .into_iter()
            .next()
            .unwrap_or_else(|| panic!("no sample {name} {labels:?} in\n{}", self.text))
    }

    /// The values of every sample `name` whose labels include `labels`.
    fn values(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        self.samples
            .iter()
            .filter(|s| s.metric == name)
            .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .map(|s| match &s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => *v,
                other => panic!("{name}: unexpected value {other:?}"),
            })
            .collect()
    }
}

impl Scrape {
    /// The buckets of every histogram `name` whose labels include `labels`.
    fn histograms(
        &self,
        name: &str,
        labels: &[(&str, &str)],
    ) -> Vec<Vec<prometheus_parse::HistogramCount>> {
        self.samples
            .iter()
            .filter(|s| s.metric == name)
            .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .filter_map(|s| match &s.value {
                prometheus_parse::Value::Histogram(h) => Some(h.clone()),
                _ => None,
            })
            .collect()
    }
}

#[test]
fn metrics_follow_the_workload() {
    if !fuse_usable() {
        return;
    }
    let mut node = Node::new().start();
    let home = node.home();
    let log = || std::fs::read_to_string(home.join("log/daemon.log")).unwrap();
    assert!(!log().contains("Prometheus"), "off by default:\n{}", log());
    let stanza = node.stanza("m", 2, DRIVE_BYTES);
    node.ok(&["nsd", "create", "-F", s(&stanza)]);
    let mnt = node.path("mnt");
    node.mounts.push(mnt.clone());
    node.ok(&[
        "fs",
        "create",
        "fs1",
        "-F",
        s(&stanza),
        "-B",
        "1M",
        "-T",
        s(&mnt),
    ]);

    let err = node.fails(&["config", "set", "metricsAddress=localhost:9710"]);
    assert!(err.contains("IP:PORT"), "{err}");
    let addr = format!("127.0.0.1:{}", free_port());
    node.ok(&["config", "set", &format!("metricsAddress={addr}")]);
    node.ok(&["shutdown"]);
    node.ok(&["startup"]);
    assert!(
        log().contains(&format!("http://{addr}/metrics")),
        "{}",
        log()
    );
    // fs1 mounts itself at startup (`-A yes`, the default).

    // A small write waits in the daemon's memory until its file's fsync (unless the kernel
    // cannot mmap direct-I/O files: then its writeback cache gathers it instead).
    {
        let mut f = std::fs::File::create(mnt.join("small")).unwrap();
        f.write_all(b"gathered").unwrap();
        let in_kernel = log().contains("gathered in the kernel's writeback cache");
        let gathered = Scrape::take(&addr).value("tessera_fs_gathered_bytes", &[("fs", "fs1")]);
        assert_eq!(gathered, if in_kernel { 0.0 } else { 8.0 });
        f.sync_all().unwrap();
        let gathered = Scrape::take(&addr).value("tessera_fs_gathered_bytes", &[("fs", "fs1")]);
        assert_eq!(gathered, 0.0);
        drop(f);
        std::fs::remove_file(mnt.join("small")).unwrap();
    }

    let before = Scrape::take(&addr);
    assert_eq!(before.values("tessera_node_info", &[]), [1.0]);
    assert_eq!(before.value("tessera_fs_mounted", &[]), 1.0);
    let written0 = before.value(
        "tessera_fs_io_bytes_total",
        &[("fs", "fs1"), ("op", "write")],
    );

    // 8 MiB written and fsynced, then read back through a cold kernel cache (a new mount:
    // like pmon's, the counters of a file system start at its mount).
    let data: Vec<u8> = (0..8 * MIB).map(|i| (i % 253) as u8).collect();
    {
        let mut f = std::fs::File::create(mnt.join("f")).unwrap();
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
    }
    let want = (8 * MIB) as f64;
    let scrape = Scrape::take(&addr);
    let written = scrape.value(
        "tessera_fs_io_bytes_total",
        &[("fs", "fs1"), ("op", "write")],
    );
    // The file's blocks reached the NSDs (plus log records and metadata pages), and the
    // fsync flushed them.
    let on_nsds = scrape.values(
        "tessera_nsd_io_bytes_total",
        &[("fs", "fs1"), ("op", "write")],
    );
    assert_eq!(on_nsds.len(), 2, "one sample per NSD:\n{}", scrape.text);
    let on_nsds: f64 = on_nsds.iter().sum();
    assert!(
        (want..=want * 1.5).contains(&on_nsds),
        "8 MiB written, {on_nsds} bytes reached the NSDs"
    );
    for nsd in ["m0", "m1"] {
        let flushes = scrape.value(
            "tessera_nsd_requests_total",
            &[("fs", "fs1"), ("nsd", nsd), ("op", "flush")],
        );
        assert!(flushes >= 1.0, "{nsd}: {flushes} flushes");
        let errors = scrape.values("tessera_nsd_errors_total", &[("fs", "fs1"), ("nsd", nsd)]);
        assert_eq!(errors, [0.0, 0.0, 0.0], "{nsd}");
    }
    assert!(
        (want..=want * 1.03).contains(&(written - written0)),
        "wrote {want} bytes, the counter moved {}",
        written - written0
    );
    // The same I/Os, one by one, in the node's I/O history [mmdiag --iohist].
    let iohist = node.ok(&["diag", "--iohist"]);
    let lines: Vec<&str> = iohist
        .lines()
        .skip_while(|l| !l.starts_with("---"))
        .skip(1)
        .take_while(|l| !l.is_empty())
        .collect();
    assert!(!lines.is_empty() && lines.len() <= 512, "{iohist}");
    for (rw, nsd) in [("W", "m0"), ("W", "m1"), ("F", "m0")] {
        assert!(
            lines.iter().any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() == 7 && f[1] == rw && f[2] == nsd && f[6] == "ok"
            }),
            "no {rw} of {nsd} in\n{iohist}"
        );
    }
    // A 4 MiB write of a 1 MiB-block file system's data is at most 2048 sectors of 512 B.
    assert!(lines
        .iter()
        .all(|l| l.split_whitespace().nth(4).unwrap().parse::<u64>().unwrap() <= 8192));
    assert!(node.ok(&["diag", "--version"]).contains("Tessera build"));
    let waiters = node.ok(&["diag", "--waiters"]);
    assert!(waiters.contains("=== diag: waiters ==="), "{waiters}");

    // An mmpmon command file: histograms only after `rhist on`, counters from `reset`.
    let cmds = node.path("pmon.cmd");
    std::fs::write(
        &cmds,
        "# a session\nver\nrhist s\nrhist on\nfs_io_s\nrhist s\nreset\nfs_io_s\nio_s\n",
    )
    .unwrap();
    let out = node.ok(&["pmon", "-i", s(&cmds)]);
    assert!(out.contains("rhist s status 16"), "{out}");
    assert!(out.contains("rhist on OK"), "{out}");
    let sessions: Vec<&str> = out.split("fs_io_s OK").collect();
    assert_eq!(sessions.len(), 3, "two fs_io_s answers:\n{out}");
    let bytes_written = |text: &str| -> u64 {
        text.lines()
            .find(|l| l.starts_with("bytes written:"))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no bytes written in\n{text}"))
    };
    assert!(bytes_written(sessions[1]) >= 8 * MIB, "{out}");
    assert!(
        sessions[1].contains("size range"),
        "the histogram after rhist on:\n{out}"
    );
    assert_eq!(bytes_written(sessions[2]), 0, "counted from reset:\n{out}");
    assert!(out.contains("io_s OK"), "{out}");
    let machine = node.ok(&["pmon", "-i", s(&cmds), "-Y", "-r", "2", "-d", "10"]);
    assert_eq!(machine.matches("_fs_io_s_ _n_").count(), 4, "{machine}");
    assert!(
        machine.contains("_rhist_ _n_") && machine.contains("_req_ s _rc_ 16"),
        "{machine}"
    );
    std::fs::write(&cmds, "fs_io_s\nrhist nr 512;1m 1.0\n").unwrap();
    let err = node.fails(&["pmon", "-i", s(&cmds)]);
    assert!(err.contains("line 2") && err.contains("rhist nr"), "{err}");

    node.ok(&["umount", "fs1"]);
    node.ok(&["mount", "fs1"]);
    assert_eq!(std::fs::read(mnt.join("f")).unwrap(), data);
    // Appended, so this mount has writes to count too.
    {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(mnt.join("f"))
            .unwrap();
        f.write_all(&data[..MIB as usize]).unwrap();
        f.sync_all().unwrap();
    }

    let after = Scrape::take(&addr);
    let fs1 = [("fs", "fs1")];
    let written = after.value(
        "tessera_fs_io_bytes_total",
        &[("fs", "fs1"), ("op", "write")],
    );
    let read = after.value(
        "tessera_fs_io_bytes_total",
        &[("fs", "fs1"), ("op", "read")],
    );
    let mib = MIB as f64;
    assert!(
        (mib..=mib * 1.03).contains(&written),
        "appended {mib} bytes, counted {written}"
    );
    assert!(
        (want..=want * 1.03).contains(&read),
        "read {want} bytes, counted {read}"
    );
    let from_nsds: f64 = after
        .values(
            "tessera_nsd_io_bytes_total",
            &[("fs", "fs1"), ("op", "read")],
        )
        .iter()
        .sum();
    assert!(
        from_nsds >= want,
        "8 MiB read cold, {from_nsds} bytes came from the NSDs"
    );
    let nsd_latencies = after.histograms(
        "tessera_nsd_request_seconds",
        &[("fs", "fs1"), ("op", "read")],
    );
    assert_eq!(nsd_latencies.len(), 2);
    let reads_sent: f64 = after
        .values(
            "tessera_nsd_requests_total",
            &[("fs", "fs1"), ("op", "read")],
        )
        .iter()
        .sum();
    let in_buckets: f64 = nsd_latencies.iter().map(|h| h.last().unwrap().count).sum();
    assert_eq!(
        in_buckets, reads_sent,
        "every NSD read is in the latency histogram"
    );
    let writes = after.value(
        "tessera_fs_operations_total",
        &[("fs", "fs1"), ("op", "write")],
    );
    let reads = after.value(
        "tessera_fs_operations_total",
        &[("fs", "fs1"), ("op", "read")],
    );
    assert!(
        writes >= 1.0 && reads >= 8.0,
        "writes {writes}, reads {reads}"
    );
    assert!(
        after.value(
            "tessera_fs_operations_total",
            &[("fs", "fs1"), ("op", "open")]
        ) >= 2.0
    );
    // Every request is in one size range of the latency histogram, and the ranges' counts
    // add up to the operation counter.
    for (op, n) in [("write", writes), ("read", reads)] {
        let counts = after.values(
            "tessera_fs_request_seconds_count",
            &[("fs", "fs1"), ("op", op)],
        );
        assert_eq!(counts.len(), 6, "six size ranges:\n{}", after.text);
        assert_eq!(counts.iter().sum::<f64>(), n, "{op}");
        let histograms =
            after.histograms("tessera_fs_request_seconds", &[("fs", "fs1"), ("op", op)]);
        assert_eq!(histograms.len(), 6);
        let mut inf = 0.0;
        for h in &histograms {
            assert_eq!(h.len(), 13, "twelve bounds and +Inf");
            assert!(h.windows(2).all(|w| w[0].count <= w[1].count), "cumulative");
            let last = h.last().unwrap();
            assert!(last.less_than.is_infinite());
            inf += last.count;
        }
        assert_eq!(inf, n, "{op}: the +Inf buckets hold every request");
        let sums = after.values(
            "tessera_fs_request_seconds_sum",
            &[("fs", "fs1"), ("op", op)],
        );
        assert!(
            sums.iter().sum::<f64>() > 0.0,
            "{op}: latencies add up to some time"
        );
    }
    assert_eq!(
        after.value("tessera_fs_inodes_used", &fs1),
        2.0,
        "the root and f"
    );
    let size = after.value("tessera_fs_size_bytes", &fs1);
    let free = after.value("tessera_fs_free_bytes", &fs1);
    assert!(
        size > 0.0 && free < size && size - free >= want + mib,
        "size {size}, free {free}"
    );
    assert_eq!(after.value("tessera_fs_checksum_errors_total", &fs1), 0.0);
    // The append and its fsync went through the recovery log: records and a group commit.
    assert!(after.value("tessera_fs_journal_records_total", &fs1) >= 1.0);
    assert!(after.value("tessera_fs_journal_commits_total", &fs1) >= 1.0);
    // Every operation above went through FUSE: opens, reads and writes are among the
    // requests answered; none is being served now, and the kernel's queue is readable.
    let served = after.value("tessera_fuse_requests_total", &fs1);
    assert!(
        served >= writes + reads + 2.0,
        "FUSE answered {served} requests for {writes} writes and {reads} reads"
    );
    assert!(served > before.value("tessera_fuse_requests_total", &fs1));
    assert_eq!(after.value("tessera_fuse_requests_active", &fs1), 0.0);
    assert_eq!(
        after.values("tessera_fuse_requests_waiting", &fs1).len(),
        1,
        "the kernel's queue depth, from fusectl:\n{}",
        after.text
    );
    let hits = after.value(
        "tessera_fs_metadata_page_lookups_total",
        &[("fs", "fs1"), ("result", "hit")],
    );
    assert!(hits > 0.0, "metadata pages were looked up");
    let mut types: HashMap<&str, &str> = HashMap::new();
    for line in after.text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            assert!(types.insert(name, kind).is_none(), "{name} described twice");
        }
    }
    assert_eq!(types.get("tessera_fs_request_seconds"), Some(&"histogram"));
    assert_eq!(types.get("tessera_fs_io_bytes"), Some(&"counter"));

    // Read-only and nothing else: unknown paths get a JSON 404, other methods are refused.
    let (status, _, body) = get(&addr, "/api/v1/nothing");
    assert_eq!(status, 404);
    let json: serde_json::Value = serde_json::from_str(&body).expect("a JSON body");
    assert!(
        json["error"].as_str().unwrap().contains("/api/v1/nothing"),
        "{body}"
    );
    let mut stream = TcpStream::connect(&addr).unwrap();
    write!(
        stream,
        "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.1 405"), "{response}");

    // A port taken by someone else stops the start with what to do.
    node.ok(&["umount", "fs1"]);
    node.ok(&["shutdown"]);
    // The daemon's process may take a moment to go after `shutdown` answered.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let squatter = loop {
        match TcpListener::bind(&addr) {
            Ok(l) => break l,
            Err(e) if std::time::Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(e) => panic!("{addr} is still taken after shutdown: {e}"),
        }
    };
    let err = node.fails(&["startup"]);
    eprintln!("startup with the port taken: {err}");
    let text = format!("{err}\n{}", log());
    assert!(
        text.contains("metricsAddress") && text.contains(&addr),
        "{text}"
    );
    drop(squatter);
    node.ok(&["startup"]);
    Scrape::take(&addr);
}
