//! NVMe/TCP host in the daemon: connections made by `tessera nvme connect` live here, are
//! kept in `$TESSERA_HOME/nvme.json` in connection order and are restored at startup
//! before the arrays and file systems that may sit on them. A remote namespace is a drive
//! like a local one: a stanza names it `device=nvme:nvme0n1` (the local name `nvme list`
//! shows) or `device=nvme:eui.<NGUID>` (its stable name, the `id` column), as an NSD
//! device or as a pdisk. Local names count subsystems in connection order, so the
//! registries record the stable name.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use tessera_drive::{BlockDevice, FileDrive};
use tessera_nvme::host::{ConnectOptions, Host, NamespaceInfo};

use super::{Daemon, Reporter};
use crate::rpc::{NvmeConnectSpec, NvmeNamespaceRow, NvmePathRow, Reply, Request};

/// The stanza prefix of a remote namespace.
pub const NVME_DEVICE_PREFIX: &str = "nvme:";

/// `nvme:nvme0n1` → `nvme0n1`.
pub fn nvme_device_name(device: &str) -> Option<&str> {
    device.strip_prefix(NVME_DEVICE_PREFIX)
}

/// Opens a drive path or a remote namespace; what the NSD layer and the declustered
/// arrays use to open their devices. A drive path is claimed exclusively, or `shared` with
/// other processes that also open it shared.
pub fn open_drive(
    host: &Host,
    device: &str,
    shared: bool,
) -> std::io::Result<Arc<dyn BlockDevice>> {
    if let Some(name) = nvme_device_name(device) {
        return match host.namespace(name) {
            Some(ns) => Ok(ns),
            None => Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!(
                    "{device}: no NVMe/TCP namespace {name} is connected on this node; \
                     `tessera nvme list` shows the namespaces, `tessera nvme connect` adds one"
                ),
            )),
        };
    }
    let path = Path::new(device);
    let drive: Arc<dyn BlockDevice> = Arc::new(if shared {
        FileDrive::open_shared(path)?
    } else {
        FileDrive::open(path)?
    });
    Ok(drive)
}

fn options(spec: &NvmeConnectSpec) -> Result<ConnectOptions> {
    let addr: SocketAddr = spec
        .traddr
        .parse()
        .map_err(|_| anyhow!("{}: not an address:port", spec.traddr))?;
    let mut o = ConnectOptions::new(addr, &spec.subnqn);
    o.host_nqn = spec.hostnqn.clone();
    o.queue_size = spec.queue_size;
    o.ctrl_loss_tmo = Duration::from_secs(u64::from(spec.ctrl_loss_tmo_s));
    o.fast_io_fail_tmo = spec
        .fast_io_fail_tmo_s
        .map(|s| Duration::from_secs(u64::from(s)));
    o.reconnect_delay = Duration::from_secs(u64::from(spec.reconnect_delay_s.max(1)));
    o.keep_alive_tmo = Duration::from_secs(u64::from(spec.keep_alive_tmo_s.max(1)));
    o.nr_io_queues = spec.nr_io_queues;
    o.header_digest = spec.hdr_digest;
    o.data_digest = spec.data_digest;
    Ok(o)
}

fn same_path(a: &NvmeConnectSpec, b: &NvmeConnectSpec) -> bool {
    a.subnqn == b.subnqn && a.traddr == b.traddr
}

fn row(ns: &NamespaceInfo) -> NvmeNamespaceRow {
    NvmeNamespaceRow {
        name: ns.name.clone(),
        id: ns.stable_name.clone(),
        subnqn: ns.subnqn.clone(),
        nsid: ns.nsid,
        size_bytes: ns.size_bytes,
        lba_bytes: ns.lba_bytes,
        nguid: ns.nguid.iter().map(|b| format!("{b:02x}")).collect(),
        paths: ns
            .paths
            .iter()
            .map(|p| NvmePathRow {
                controller: p.controller.clone(),
                traddr: p.addr.to_string(),
                cntlid: p.cntlid,
                ana_state: p.ana_state.to_string(),
                state: p.state.to_string(),
                commands: p.stats.commands,
                bytes: p.stats.read_bytes + p.stats.write_bytes,
                errors: p.stats.errors,
                retries: p.stats.retries,
                latency_us_p50: p.stats.latency_us_percentile(50),
                latency_us_p99: p.stats.latency_us_percentile(99),
            })
            .collect(),
    }
}

impl Daemon {
    /// Reconnects every controller of `nvme.json`. One that does not answer is logged and
    /// left out; the drives on it then show as missing, and the rest of the node works.
    pub(super) fn restore_nvme_at_start(&self) {
        let registry = match self.home.nvme() {
            Ok(r) => r,
            Err(e) => {
                tracing::error!("cannot read the NVMe connection list: {e:#}");
                return;
            }
        };
        for spec in &registry.connections {
            let result =
                options(spec).and_then(|o| self.nvme.connect(o).map_err(|e| anyhow!("{e}")));
            match result {
                Ok(_) => tracing::info!("NVMe/TCP: reconnected {} at {}", spec.subnqn, spec.traddr),
                Err(e) => tracing::error!(
                    "NVMe/TCP: cannot reconnect {} at {}: {e:#}; `tessera nvme connect` \
                     retries it",
                    spec.subnqn,
                    spec.traddr
                ),
            }
        }
    }

    pub(super) fn nvme_request(&self, request: Request, r: &mut Reporter) -> Result<Reply> {
        match request {
            Request::NvmeConnect(specs) => self.nvme_connect(specs, r),
            Request::NvmeDisconnect { subnqn, traddr } => {
                self.nvme_disconnect(subnqn.as_deref(), traddr.as_deref())
            }
            Request::NvmeList => Ok(Reply::NvmeNamespaces(
                self.nvme.list().iter().map(row).collect(),
            )),
            other => bail!("not an NVMe request: {other:?}"),
        }
    }

    fn nvme_connect(&self, specs: Vec<NvmeConnectSpec>, r: &mut Reporter) -> Result<Reply> {
        let _admin = self.admin.lock();
        let mut registry = self.home.nvme()?;
        let mut subsystems = Vec::new();
        for spec in specs {
            // The host, not nvme.json, says what is connected: a path that gave up after
            // ctrl_loss_tmo is gone from the host but still listed for the next start, and
            // must connect again (its namespaces keep their names).
            let opts = options(&spec)?;
            let live = self
                .nvme
                .connections()
                .iter()
                .any(|c| c.subnqn == opts.subnqn && c.addr == opts.addr);
            if live {
                r.info(format!(
                    "{} at {}: already connected",
                    spec.subnqn, spec.traddr
                ));
                subsystems.push(spec.subnqn.clone());
                continue;
            }
            let report = self.nvme.connect(opts).map_err(|e| {
                // Most host errors begin with the address already.
                let why = e.to_string();
                let why = why
                    .strip_prefix(&spec.traddr)
                    .map_or(why.as_str(), |rest| {
                        rest.trim_start_matches(':').trim_start()
                    })
                    .to_string();
                anyhow!("{} at {}: {why}", spec.subnqn, spec.traddr)
            })?;
            r.info(format!(
                "{} at {}: connected as {}",
                spec.subnqn, spec.traddr, report.controller
            ));
            subsystems.push(spec.subnqn.clone());
            registry.connections.retain(|c| !same_path(c, &spec));
            registry.connections.push(spec);
            self.home.save_nvme(&registry)?;
        }
        let rows = self
            .nvme
            .list()
            .iter()
            .filter(|ns| subsystems.contains(&ns.subnqn))
            .map(row)
            .collect();
        Ok(Reply::NvmeNamespaces(rows))
    }

    fn nvme_disconnect(&self, subnqn: Option<&str>, traddr: Option<&str>) -> Result<Reply> {
        let _admin = self.admin.lock();
        let mut registry = self.home.nvme()?;
        let removed = match subnqn {
            None => {
                registry.connections.clear();
                self.nvme.disconnect_all()
            }
            Some(nqn) => {
                let addr = match traddr {
                    Some(a) => Some(
                        a.parse::<SocketAddr>()
                            .map_err(|_| anyhow!("{a}: not an address:port"))?,
                    ),
                    None => None,
                };
                registry
                    .connections
                    .retain(|c| c.subnqn != nqn || traddr.is_some_and(|a| c.traddr != a));
                self.nvme
                    .disconnect(nqn, addr)
                    .map_err(|e| anyhow!("{nqn}: {e}"))?
            }
        };
        self.home.save_nvme(&registry)?;
        Ok(Reply::NvmeDisconnected(removed))
    }
}
