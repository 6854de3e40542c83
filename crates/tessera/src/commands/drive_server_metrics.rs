//! `drive-server --metrics-address IP:PORT`: the drive server's Prometheus endpoint. A
//! scrape reads the counters the server keeps anyway (per port: connections, commands,
//! bytes, errors; per namespace: reads, writes, other commands, bytes, errors), so the
//! exporter costs the NVMe/TCP path nothing. Only `/metrics` is served; other paths get a
//! JSON 404 and other methods 405.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Result;
use axum::http::Uri;
use axum::routing::get;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;
use tessera_nvme::target::StatsSource;

use crate::http_server;
use crate::openmetrics::{counters, gauges, Labels};

struct DriveServerCollector {
    stats: StatsSource,
}

impl fmt::Debug for DriveServerCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DriveServerCollector")
    }
}

impl Collector for DriveServerCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let s = self.stats.stats();
        let port = |id: u16| -> Labels { vec![("port", id.to_string())] };
        let with = |mut l: Labels, k: &'static str, v: &str| {
            l.push((k, v.to_string()));
            l
        };
        let mut open = Vec::new();
        let mut accepted = Vec::new();
        let mut commands = Vec::new();
        let mut port_bytes = Vec::new();
        let mut port_errors = Vec::new();
        for p in &s.ports {
            open.push((
                port(p.portid),
                i64::try_from(p.connections_open).unwrap_or(i64::MAX),
            ));
            accepted.push((port(p.portid), p.connections_total));
            commands.push((port(p.portid), p.commands));
            port_bytes.push((with(port(p.portid), "op", "read"), p.read_bytes));
            port_bytes.push((with(port(p.portid), "op", "write"), p.write_bytes));
            port_errors.push((port(p.portid), p.errors));
        }
        gauges(
            &mut enc,
            "tessera_drive_server_connections",
            "NVMe/TCP connections (queues) open on each port",
            &open,
        )?;
        counters(
            &mut enc,
            "tessera_drive_server_connections_accepted",
            "NVMe/TCP connections accepted on each port since the server started",
            &accepted,
        )?;
        counters(
            &mut enc,
            "tessera_drive_server_commands",
            "Commands received on each port (admin and I/O)",
            &commands,
        )?;
        counters(
            &mut enc,
            "tessera_drive_server_io_bytes",
            "Bytes sent to hosts (read) and received from them (write) on each port",
            &port_bytes,
        )?;
        counters(
            &mut enc,
            "tessera_drive_server_errors",
            "Commands completed with an error status on each port",
            &port_errors,
        )?;
        let mut requests = Vec::new();
        let mut bytes = Vec::new();
        let mut errors = Vec::new();
        for n in &s.namespaces {
            let ns = || -> Labels {
                vec![
                    ("subsystem", n.subnqn.clone()),
                    ("nsid", n.nsid.to_string()),
                ]
            };
            requests.push((with(ns(), "op", "read"), n.reads));
            requests.push((with(ns(), "op", "write"), n.writes));
            requests.push((with(ns(), "op", "other"), n.other));
            bytes.push((with(ns(), "op", "read"), n.read_bytes));
            bytes.push((with(ns(), "op", "write"), n.write_bytes));
            errors.push((ns(), n.errors));
        }
        counters(
            &mut enc,
            "tessera_drive_server_namespace_requests",
            "I/O commands on each namespace: read, write, other (flush, write zeroes, \
             dataset management, reservations)",
            &requests,
        )?;
        counters(
            &mut enc,
            "tessera_drive_server_namespace_io_bytes",
            "Bytes read from and written to each namespace",
            &bytes,
        )?;
        counters(
            &mut enc,
            "tessera_drive_server_namespace_errors",
            "I/O commands on each namespace completed with an error",
            &errors,
        )
    }
}

/// Starts serving `/metrics` on `address`; the port is bound before this returns.
pub fn start(address: &str, stats: StatsSource) -> Result<SocketAddr> {
    let listener = http_server::bind(
        address,
        "--metrics-address",
        "choose another port, or leave --metrics-address out",
    )?;
    let mut registry = Registry::default();
    registry.register_collector(Box::new(DriveServerCollector { stats }));
    let registry = Arc::new(registry);
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let registry = Arc::clone(&registry);
                async move { http_server::metrics_response(&registry) }
            }),
        )
        .fallback(|uri: Uri| async move { http_server::not_found(uri.path(), "/metrics") });
    http_server::spawn(listener, app)
}
