//! `tessera perf net` through the CLI: a server process, a run against it that reports
//! throughput for reads and writes, and garbage on the socket that is refused without
//! taking the server down.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};

use common::BIN;

struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The `-Y` value of `column` on the `total` row.
fn total(listing: &str, column: &str) -> f64 {
    let header: Vec<&str> = listing
        .lines()
        .find(|l| l.contains(":HEADER:"))
        .expect("header")
        .split(':')
        .collect();
    let at = header.iter().position(|h| *h == column).expect("column");
    let row: Vec<&str> = listing
        .lines()
        .find(|l| l.contains(":total:"))
        .expect("total row")
        .split(':')
        .collect();
    row[at].parse().expect("number")
}

#[test]
fn perf_net_measures_both_directions_and_survives_garbage() {
    let mut child = Command::new(BIN)
        .args(["perf", "net", "server", "-l", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn server");
    let stdout = child.stdout.take().expect("stdout");
    let _server = Server(child);
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("listening line");
    let addr = line.trim().rsplit(' ').next().expect("address").to_string();
    assert!(addr.starts_with("127.0.0.1:"), "{line}");

    // Garbage first: the server closes that connection and keeps serving.
    let mut bad = TcpStream::connect(&addr).expect("connect");
    bad.write_all(b"GET / HTTP/1.0\r\n\r\n")
        .expect("send garbage");
    let mut rest = Vec::new();
    let _ = bad.read_to_end(&mut rest);
    assert!(rest.is_empty(), "the server answered garbage: {rest:?}");

    for op in ["write", "read"] {
        let out = Command::new(BIN)
            .args([
                "perf", "net", "run", "-s", &addr, "--op", op, "--size", "256K",
            ])
            .args(["-t", "2", "--seconds", "1", "-Y"])
            .output()
            .expect("run perf");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(total(&text, "MBps") > 0.0, "{text}");
        assert!(
            total(&text, "latencyUsP99") >= total(&text, "latencyUsP50"),
            "{text}"
        );
    }
    let out = Command::new(BIN)
        .args(["perf", "net", "run", "-s", "127.0.0.1:1", "--seconds", "1"])
        .output()
        .expect("run perf");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("perf net server"),
        "{err}"
    );
}
