//! The daemon's read-only API and web dashboard on `metricsAddress`, and the health and
//! diag commands, on a file system over an 8+2p vdisk while a workload writes to it: the
//! API answers what the CLI's `-Y` listings say for the same objects, the throughput
//! history shows the writes, a failed pdisk turns FAILED in `tessera health`, in the
//! metrics and on the dashboard, and the dashboard, loaded in headless Chromium, draws
//! non-zero throughput (a screenshot is kept in target/test-artifacts/).

mod common;

use std::collections::HashMap;
use std::io::{Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

const MIB: usize = 1 << 20;

/// The status code and the body.
fn get(addr: &str, path: &str) -> (u16, String) {
    let (status, _, body) = http_get(addr, path);
    (status, body)
}

fn api(addr: &str, path: &str) -> Value {
    let (status, body) = get(addr, path);
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {body}"))
}

/// The data rows of `-Y` output as maps from the HEADER line's field names.
fn y_rows(out: &str) -> Vec<HashMap<String, String>> {
    let mut header: Vec<String> = Vec::new();
    let mut rows = Vec::new();
    for line in out.lines() {
        let fields: Vec<&str> = line.split(':').collect();
        if fields.get(2) == Some(&"HEADER") {
            header = fields.iter().map(|f| f.to_string()).collect();
        } else if fields.len() == header.len() {
            let unescape = |v: &str| v.replace("%3A", ":").replace("%25", "%");
            rows.push(
                header
                    .iter()
                    .zip(&fields)
                    .skip(6)
                    .map(|(k, v)| (k.clone(), unescape(v)))
                    .collect(),
            );
        }
    }
    rows
}

/// The sum of the samples of `name` whose labels contain every one of `labels`.
fn sum_samples(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{'))
        })
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

fn chromium() -> Option<PathBuf> {
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .map(|name| PathBuf::from("/usr/bin").join(name))
        .find(|p| p.exists())
}

/// Waits up to a minute for `check` to hold, polling.
fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn api_dashboard_health_and_diag_under_a_workload() {
    if !fuse_usable() {
        return;
    }
    let mut node = Node::new().start();
    let addr = format!("127.0.0.1:{}", free_port());
    node.ok(&["config", "set", &format!("metricsAddress={addr}")]);
    node.ok(&["shutdown"]);
    node.ok(&["startup"]);

    let mnt = node.file_system_on_vdisk("512M");
    node.ok(&["mount", "gfs"]);

    // A writer that keeps going until told to stop: 1 MiB writes over a 32 MiB file,
    // fsync every 8.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = Arc::clone(&stop);
        let path = mnt.join("load");
        std::thread::spawn(move || {
            let mut f = std::fs::File::create(path).unwrap();
            let chunk = vec![0x5au8; MIB];
            let mut written = 0u64;
            let mut i = 0usize;
            while !stop.load(Ordering::Relaxed) {
                f.seek(SeekFrom::Start(((i % 32) * MIB) as u64)).unwrap();
                f.write_all(&chunk).unwrap();
                written += MIB as u64;
                i += 1;
                if i.is_multiple_of(8) {
                    f.sync_all().unwrap();
                }
            }
            f.sync_all().unwrap();
            written
        })
    };

    // The API's index, and a JSON 404 for what it does not serve.
    let index = api(&addr, "/api/v1");
    let paths: Vec<&str> = index["paths"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["path"].as_str().unwrap())
        .collect();
    assert!(paths.contains(&"/api/v1/pdisks"), "{index}");
    for missing in [
        "/api/v1/filesystems/nope",
        "/api/v1/nothing",
        "/api/v1/das/x/y",
    ] {
        let (status, body) = get(&addr, missing);
        assert_eq!(status, 404, "{missing}: {body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert!(v["error"].is_string(), "{body}");
    }
    let (status, body) = get(&addr, "/api/v1/filesystems/gfs/throughput?since=soon");
    assert_eq!(status, 400, "{body}");

    // The same objects through the API and the CLI's -Y.
    let cli_nsds = y_rows(&node.ok(&["nsd", "ls", "-Y"]));
    let api_nsds = api(&addr, "/api/v1/nsds");
    let names = |v: &Value, key: &str| -> Vec<String> {
        let mut n: Vec<String> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x[key].as_str().unwrap().to_string())
            .collect();
        n.sort();
        n
    };
    let mut cli_names: Vec<String> = cli_nsds.iter().map(|r| r["diskName"].clone()).collect();
    cli_names.sort();
    assert_eq!(names(&api_nsds, "name"), cli_names);
    let cli_pdisks = y_rows(&node.ok(&["pdisk", "ls", "-Y"]));
    let api_pdisks = api(&addr, "/api/v1/pdisks");
    assert_eq!(cli_pdisks.len(), 12);
    for row in &cli_pdisks {
        let p = api_pdisks
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == row["pdisk"].as_str())
            .unwrap_or_else(|| panic!("pdisk {} not in the API: {api_pdisks}", row["pdisk"]));
        assert_eq!(p["state"], row["state"].as_str());
        assert_eq!(p["enclosure"], row["enclosure"].as_str());
        assert_eq!(p["capacity_bytes"].to_string(), row["capacityBytes"]);
    }
    let cli_das = y_rows(&node.ok(&["da", "ls", "-Y"]));
    let api_das = api(&addr, "/api/v1/das");
    assert_eq!(names(&api_das, "name"), ["da1"]);
    let da_row = cli_das
        .iter()
        .find(|r| r.get("da").map(String::as_str) == Some("da1"))
        .unwrap();
    assert_eq!(
        api_das[0]["capacity_bytes"].to_string(),
        da_row["capacityBytes"]
    );
    let cli_disks = y_rows(&node.ok(&["disk", "ls", "gfs", "-Y"]));
    let api_fs = api(&addr, "/api/v1/filesystems/gfs");
    assert_eq!(api_fs["record"]["name"], "gfs");
    assert_eq!(
        cli_disks.len(),
        api_fs["descriptor"]["disks"].as_array().unwrap().len()
    );
    assert_eq!(api_fs["disks_up"], serde_json::json!([true]));
    let cluster = api(&addr, "/api/v1/cluster");
    let cli_cluster = node.ok(&["cluster", "ls"]);
    assert!(
        cli_cluster.contains(cluster["identity"]["name"].as_str().unwrap()),
        "{cli_cluster}\n{cluster}"
    );
    let nodes = api(&addr, "/api/v1/nodes");
    assert_eq!(nodes["rows"][0]["state"], "active", "{nodes}");

    // Throughput over time: samples each second, the writes among them.
    eventually("write throughput in the history", || {
        let t = api(&addr, "/api/v1/filesystems/gfs/throughput");
        t["samples"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["write_bytes_per_s"].as_f64().unwrap() > 0.0)
    });
    let t = api(&addr, "/api/v1/filesystems/gfs/throughput");
    let samples = t["samples"].as_array().unwrap();
    let last_ms = samples.last().unwrap()["unix_ms"].as_u64().unwrap();
    let newer = api(
        &addr,
        &format!("/api/v1/filesystems/gfs/throughput?since={last_ms}"),
    );
    assert!(
        newer["samples"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["unix_ms"].as_u64().unwrap() > last_ms),
        "{newer}"
    );
    let busy = samples
        .iter()
        .find(|s| s["write_bytes_per_s"].as_f64().unwrap() > 0.0)
        .unwrap();
    assert!(busy["write_ops_per_s"].as_f64().unwrap() > 0.0, "{busy}");
    assert!(busy["write_p50_ms"].as_f64().unwrap() > 0.0, "{busy}");
    let list = api(&addr, "/api/v1/filesystems");
    let gfs = &list["filesystems"][0];
    assert_eq!(gfs["name"], "gfs");
    assert_eq!(gfs["mounted_here"], true);
    assert!(gfs["usage"]["size_bytes"].as_u64().unwrap() > 0, "{list}");
    let metrics = api(&addr, "/api/v1/metrics");
    assert!(
        metrics["filesystems"][0]["bytes_written"].as_u64().unwrap() > 0,
        "{metrics}"
    );

    // The array's side of the same writes: the vdisk served them, its pdisks wrote them with
    // their parity, and each pdisk's requests are in its latency histogram.
    let (_, text) = get(&addr, "/metrics");
    let vdisk_written = sum_samples(&text, "tessera_vdisk_io_bytes_total", &[r#"op="write""#]);
    let pdisk_written = sum_samples(&text, "tessera_pdisk_io_bytes_total", &[r#"op="write""#]);
    assert!(vdisk_written > 0.0, "{text}");
    assert!(
        pdisk_written >= vdisk_written,
        "pdisks wrote {pdisk_written} bytes for {vdisk_written} written to the vdisk"
    );
    let pdisk_writes = sum_samples(&text, "tessera_pdisk_requests_total", &[r#"op="write""#]);
    let in_histograms = sum_samples(
        &text,
        "tessera_pdisk_request_seconds_count",
        &[r#"op="write""#],
    );
    assert!(
        pdisk_writes > 0.0 && in_histograms == pdisk_writes,
        "{text}"
    );
    assert!(
        sum_samples(&text, "tessera_vdisk_operations_total", &[r#"op="write""#]) > 0.0,
        "{text}"
    );
    assert_eq!(
        sum_samples(&text, "tessera_vdisk_stripes", &[r#"state="critical""#]),
        0.0
    );

    // Healthy to start with; a failed pdisk turns FAILED with an event, in the CLI, the
    // API and the metrics.
    let health = node.ok(&["health", "node", "show"]);
    assert!(health.contains("Node status:    HEALTHY"), "{health}");
    assert!(health.contains("FILESYSTEM"), "{health}");
    node.ok(&["pdisk", "fail", "e1s1"]);
    eventually("pdisk e1s1 FAILED in the health report", || {
        let h = api(&addr, "/api/v1/health");
        h["components"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["component"] == "pdisk" && c["entity"] == "e1s1" && c["status"] == "FAILED")
    });
    let show = node.ok(&["health", "pdisk", "show", "e1s1"]);
    assert!(show.contains("FAILED") && show.contains("dead"), "{show}");
    let y = y_rows(&node.ok(&["health", "pdisk", "show", "-Y"]));
    assert_eq!(y.len(), 12, "one row per pdisk");
    let log = node.ok(&["health", "node", "eventlog"]);
    assert!(
        log.contains("pdisk_failed") && log.contains("e1s1"),
        "{log}"
    );
    let err = node.fails(&["health", "fs", "show", "nope"]);
    assert!(err.contains("nope"), "{err}");
    let events = api(&addr, "/api/v1/events");
    assert!(
        events["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["event"] == "pdisk_failed" && e["severity"] == "error"),
        "{events}"
    );
    let (_, text) = get(&addr, "/metrics");
    assert!(
        text.contains(r#"tessera_pdisk_state{da="da1",pdisk="e1s1",state="dead"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"tessera_health_status{component="pdisk",entity="e1s1"} 2"#),
        "{text}"
    );
    // Every metric the Grafana dashboard queries, but those of drive servers and NVMe/TCP
    // paths (tests/nvme.rs checks those), is one this daemon exports.
    let exported = described_families(&text);
    for family in grafana_dashboard_metrics() {
        if family.starts_with("tessera_drive_server_") || family.starts_with("tessera_nvme_") {
            continue;
        }
        assert!(
            exported.contains(&family),
            "the Grafana dashboard queries {family}, not exported:\n{text}"
        );
    }

    // mmdiag's sections.
    let diag = node.ok(&[
        "diag",
        "--waiters",
        "--memory",
        "--stats",
        "--network",
        "--config",
    ]);
    for section in ["waiters", "memory", "stats", "network", "config"] {
        assert!(diag.contains(&format!("=== diag: {section} ===")), "{diag}");
    }
    assert!(
        diag.contains("pagepool") && diag.contains("maxFilesToCache"),
        "{diag}"
    );
    assert!(diag.contains(&format!("! metricsAddress {addr}")), "{diag}");
    assert!(
        diag.contains("File system gfs:") && diag.contains("vd0"),
        "{diag}"
    );
    assert!(diag.contains("active"), "{diag}");
    let all = node.ok(&["diag"]);
    assert!(all.contains("=== diag: iohist ===") && all.contains("=== diag: memory ==="));

    // The dashboard in a real browser: it must draw the writes and show the dead pdisk.
    let html = get(&addr, "/").1;
    assert!(html.contains("/dashboard/uPlot.iife.min.js"), "{html}");
    let (status, js) = get(&addr, "/dashboard/uPlot.iife.min.js");
    assert_eq!(status, 200);
    assert!(js.contains("uPlot"));
    match chromium() {
        Some(browser) => check_in_browser(&browser, &addr, &node),
        None => {
            assert!(
                std::env::var_os("CI").is_none(),
                "Chromium is missing; .ci/run installs it (apt-get install chromium)"
            );
            eprintln!("chromium not installed: the dashboard was not loaded in a browser");
        }
    }

    stop.store(true, Ordering::Relaxed);
    let written = writer.join().unwrap();
    assert!(written > 0);
    node.ok(&["umount", "gfs"]);
}

fn check_in_browser(browser: &PathBuf, addr: &str, node: &Node) {
    let profile = node.path("chromium-profile");
    let url = format!("http://{addr}/");
    let run = |extra: &[&str]| {
        let out = Command::new(browser)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--hide-scrollbars",
                "--window-size=1400,2400",
                // Lets the page's fetches and first refreshes finish before the DOM is
                // taken (the budget is virtual time; network waits pause it).
                "--virtual-time-budget=6000",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .args(extra)
            .arg(&url)
            .output()
            .expect("run chromium");
        assert!(
            out.status.success(),
            "chromium failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let dom = run(&["--dump-dom"]);
    let attr = |tag_marker: &str, name: &str| -> Option<String> {
        let at = dom.find(tag_marker)?;
        let tag_end = at + dom[at..].find('>')?;
        let tag_start = dom[..at].rfind('<')?;
        let tag = &dom[tag_start..tag_end];
        let key = format!("{name}=\"");
        let from = tag.find(&key)? + key.len();
        Some(tag[from..from + tag[from..].find('"')?].to_string())
    };
    let peak: f64 = attr("data-fs=\"gfs\"", "data-peak-write-bytes-per-s")
        .unwrap_or_else(|| panic!("no file-system card for gfs in the page:\n{dom}"))
        .parse()
        .unwrap();
    assert!(peak > 0.0, "the chart shows no write throughput:\n{dom}");
    let samples: usize = attr("data-fs=\"gfs\"", "data-samples")
        .unwrap()
        .parse()
        .unwrap();
    assert!(samples >= 2, "{samples} samples");
    assert!(
        dom.contains("class=\"uplot"),
        "the charts are drawn:\n{dom}"
    );
    assert_eq!(
        attr("data-pdisk=\"e1s1\"", "data-state").as_deref(),
        Some("dead")
    );
    assert!(
        dom.contains("FAILED (dead)"),
        "the dead pdisk shows as failed:\n{dom}"
    );
    assert_eq!(
        attr("id=\"node-status\"", "data-status").as_deref(),
        Some("FAILED"),
        "the node rolls up its worst component"
    );
    assert!(!dom.contains("cannot reach the daemon"), "{dom}");

    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/test-artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    let shot = dir.join("dashboard.png");
    let _ = std::fs::remove_file(&shot);
    run(&[&format!("--screenshot={}", shot.display())]);
    let png = std::fs::read(&shot).expect("the screenshot");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "{} bytes",
        png.len()
    );
    eprintln!("dashboard screenshot: {}", shot.display());
}
