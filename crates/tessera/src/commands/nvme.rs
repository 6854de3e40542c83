//! `tessera nvme ...`: the host side of NVMe/TCP, in nvme-cli's words. Discovery runs in
//! the CLI process (it needs no state); connections belong to the daemon, which keeps them
//! in `$TESSERA_HOME/nvme.json` and restores them at restart.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};

use super::da::human_bytes as format_bytes;
use super::{call, unexpected};
use crate::cli::{NvmeConnectTunables, NvmeTargetArgs};
use crate::config::Home;
use crate::output::{Table, YRecord};
use crate::rpc::{NvmeConnectSpec, NvmeNamespaceRow, Reply, Request};

/// The IANA port of NVMe/TCP discovery controllers.
pub const DISCOVERY_PORT: u16 = 8009;
/// The IANA port of NVMe/TCP I/O controllers.
pub const IO_PORT: u16 = 4420;

/// Resolves `-a`/`-s` to one socket address; names resolve to their first address.
pub fn resolve(traddr: &str, trsvcid: u16) -> Result<SocketAddr> {
    let host = traddr.trim_start_matches('[').trim_end_matches(']');
    (host, trsvcid)
        .to_socket_addrs()
        .with_context(|| format!("-a {traddr}: not an address or a known host name"))?
        .next()
        .ok_or_else(|| anyhow!("-a {traddr}: the name has no address"))
}

fn check_transport(transport: &str) -> Result<()> {
    if transport != "tcp" {
        bail!("-t {transport}: only the tcp transport is supported (use -t tcp)");
    }
    Ok(())
}

/// The node's host identity, or the one `-q` names (with the node's host identifier).
fn identity(home: &Home, hostnqn: Option<&str>) -> Result<tessera_nvme::host::HostIdentity> {
    std::fs::create_dir_all(home.root())
        .with_context(|| format!("cannot create {}", home.root().display()))?;
    let mut id = tessera_nvme::host::HostIdentity::load_or_create(&home.hostnqn_path())
        .map_err(|e| anyhow!("{}: {e}", home.hostnqn_path().display()))?;
    if let Some(nqn) = hostnqn {
        tessera_nvme::wire::text::validate_nqn(nqn).map_err(|e| anyhow!("-q {nqn}: {e}"))?;
        id.nqn = nqn.to_string();
    }
    Ok(id)
}

pub fn show_hostnqn(home: &Home) -> Result<()> {
    println!("{}", identity(home, None)?.nqn);
    Ok(())
}

/// One record of a discovery log page, reduced to what the CLI prints and connects to.
struct Record {
    trtype: String,
    adrfam: String,
    subtype: String,
    portid: u16,
    trsvcid: String,
    subnqn: String,
    traddr: String,
}

fn discover_records(home: &Home, addr: SocketAddr, hostnqn: Option<&str>) -> Result<Vec<Record>> {
    let id = identity(home, hostnqn)?;
    let opts = tessera_nvme::host::DiscoverOptions::default();
    let entries = tessera_nvme::host::discover(addr, &id, &opts)
        .map_err(|e| anyhow!("{}", discovery_error(addr, &e.to_string())))?;
    Ok(entries
        .into_iter()
        .map(|e| Record {
            trtype: trtype_name(e.trtype).to_string(),
            adrfam: adrfam_name(e.adrfam).to_string(),
            subtype: subtype_name(e.subtype).to_string(),
            portid: e.portid,
            trsvcid: e.trsvcid.as_str().trim().to_string(),
            subnqn: e.subnqn.as_str().to_string(),
            traddr: e.traddr.as_str().trim().to_string(),
        })
        .collect())
}

/// "discovery at ADDR: why", naming the address once: most host errors already begin
/// with it.
fn discovery_error(addr: SocketAddr, why: &str) -> String {
    let why = why
        .strip_prefix(&addr.to_string())
        .map_or(why, |rest| rest.trim_start_matches(':').trim_start());
    format!("discovery at {addr}: {why}")
}

/// The names nvme-cli prints for the discovery log's codes.
fn trtype_name(code: u8) -> &'static str {
    use tessera_nvme::wire::log::trtype;
    match code {
        trtype::TCP => "tcp",
        trtype::RDMA => "rdma",
        trtype::FC => "fc",
        trtype::LOOP => "loop",
        _ => "unrecognized",
    }
}

fn adrfam_name(code: u8) -> &'static str {
    use tessera_nvme::wire::log::adrfam;
    match code {
        adrfam::IPV4 => "ipv4",
        adrfam::IPV6 => "ipv6",
        adrfam::IB => "infiniband",
        adrfam::FC => "fibre-channel",
        adrfam::LOOP => "intra-host",
        _ => "unrecognized",
    }
}

fn subtype_name(code: u8) -> &'static str {
    use tessera_nvme::wire::log::subtype;
    match code {
        subtype::REFERRAL => "referral",
        subtype::NVM => "nvme subsystem",
        subtype::CURRENT_DISCOVERY => "current discovery subsystem",
        _ => "unrecognized",
    }
}

pub fn discover(home: &Home, target: &NvmeTargetArgs, machine: bool) -> Result<()> {
    check_transport(&target.transport)?;
    let addr = resolve(&target.traddr, target.trsvcid.unwrap_or(DISCOVERY_PORT))?;
    let records = discover_records(home, addr, target.hostnqn.as_deref())?;
    if machine {
        let y = YRecord::new("nvmeDiscover", "");
        println!(
            "{}",
            y.header(&[
                "entry", "trtype", "adrfam", "subtype", "portid", "trsvcid", "subnqn", "traddr"
            ])
        );
        for (i, r) in records.iter().enumerate() {
            println!(
                "{}",
                y.data(&[
                    i.to_string(),
                    r.trtype.clone(),
                    r.adrfam.clone(),
                    r.subtype.clone(),
                    r.portid.to_string(),
                    r.trsvcid.clone(),
                    r.subnqn.clone(),
                    r.traddr.clone(),
                ])
            );
        }
        return Ok(());
    }
    println!("\nDiscovery Log Number of Records {}", records.len());
    for (i, r) in records.iter().enumerate() {
        println!("=====Discovery Log Entry {i}======");
        println!("trtype:  {}", r.trtype);
        println!("adrfam:  {}", r.adrfam);
        println!("subtype: {}", r.subtype);
        println!("portid:  {}", r.portid);
        println!("trsvcid: {}", r.trsvcid);
        println!("subnqn:  {}", r.subnqn);
        println!("traddr:  {}", r.traddr);
    }
    Ok(())
}

fn spec(
    addr: SocketAddr,
    subnqn: &str,
    hostnqn: Option<&str>,
    t: &NvmeConnectTunables,
) -> Result<NvmeConnectSpec> {
    tessera_nvme::wire::text::validate_nqn(subnqn).map_err(|e| anyhow!("-n {subnqn}: {e}"))?;
    if t.queue_size < 2 || t.queue_size > 1024 {
        bail!("-Q {}: the queue size must be 2 to 1024", t.queue_size);
    }
    if t.keep_alive_tmo == 0 || t.keep_alive_tmo > 3600 {
        bail!(
            "-k {}: the keep-alive timeout must be 1 to 3600 seconds",
            t.keep_alive_tmo
        );
    }
    if t.nr_io_queues == Some(0) {
        bail!("-i 0: at least one I/O queue is needed");
    }
    if let Some(f) = t.fast_io_fail_tmo.filter(|&f| f > t.ctrl_loss_tmo) {
        bail!(
            "-f {f}: fast-io-fail-tmo is longer than ctrl-loss-tmo ({} s), so it would never \
             take effect; make it shorter, or raise -l",
            t.ctrl_loss_tmo
        );
    }
    Ok(NvmeConnectSpec {
        traddr: addr.to_string(),
        subnqn: subnqn.to_string(),
        hostnqn: hostnqn.map(str::to_string),
        queue_size: t.queue_size,
        ctrl_loss_tmo_s: t.ctrl_loss_tmo,
        fast_io_fail_tmo_s: t.fast_io_fail_tmo,
        reconnect_delay_s: t.reconnect_delay.max(1),
        keep_alive_tmo_s: t.keep_alive_tmo,
        nr_io_queues: t.nr_io_queues,
        hdr_digest: t.hdr_digest,
        data_digest: t.data_digest,
    })
}

pub fn connect(
    home: &Home,
    target: &NvmeTargetArgs,
    nqn: &str,
    t: &NvmeConnectTunables,
) -> Result<()> {
    check_transport(&target.transport)?;
    let addr = resolve(&target.traddr, target.trsvcid.unwrap_or(IO_PORT))?;
    if let Some(q) = &target.hostnqn {
        tessera_nvme::wire::text::validate_nqn(q).map_err(|e| anyhow!("-q {q}: {e}"))?;
    }
    let spec = spec(addr, nqn, target.hostnqn.as_deref(), t)?;
    connect_specs(home, vec![spec])
}

fn connect_specs(home: &Home, specs: Vec<NvmeConnectSpec>) -> Result<()> {
    match call(home, &Request::NvmeConnect(specs))? {
        Reply::NvmeNamespaces(rows) => {
            print_list(&rows);
            Ok(())
        }
        other => Err(unexpected(other)),
    }
}

/// Options of one discovery.conf line (`--transport=tcp --traddr=A --trsvcid=P`, also
/// with `-t tcp -a A -s P`), as nvme-cli reads `/etc/nvme/discovery.conf`.
fn parse_discovery_line(
    line: &str,
    n: usize,
    file: &Path,
) -> Result<(String, u16, Option<String>)> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let (mut traddr, mut trsvcid, mut hostnqn) = (None, DISCOVERY_PORT, None);
    let mut i = 0;
    while i < words.len() {
        let (key, value) = match words[i].split_once('=') {
            Some((k, v)) => (k, v.to_string()),
            None => {
                let v = words
                    .get(i + 1)
                    .ok_or_else(|| anyhow!("{}:{n}: {} needs a value", file.display(), words[i]))?;
                i += 1;
                (words[i - 1], v.to_string())
            }
        };
        match key {
            "--transport" | "-t" => {
                check_transport(&value).map_err(|e| anyhow!("{}:{n}: {e}", file.display()))?
            }
            "--traddr" | "-a" => traddr = Some(value),
            "--trsvcid" | "-s" => {
                trsvcid = value.parse().map_err(|_| {
                    anyhow!("{}:{n}: --trsvcid {value}: not a TCP port", file.display())
                })?
            }
            "--hostnqn" | "-q" => hostnqn = Some(value),
            other => bail!(
                "{}:{n}: unknown option {other}; use --transport, --traddr, --trsvcid, --hostnqn",
                file.display()
            ),
        }
        i += 1;
    }
    let traddr = traddr.ok_or_else(|| anyhow!("{}:{n}: no --traddr", file.display()))?;
    Ok((traddr, trsvcid, hostnqn))
}

#[allow(clippy::too_many_arguments)]
pub fn connect_all(
    home: &Home,
    config: Option<&Path>,
    transport: &str,
    traddr: Option<&str>,
    trsvcid: Option<u16>,
    hostnqn: Option<&str>,
    t: &NvmeConnectTunables,
) -> Result<()> {
    check_transport(transport)?;
    let mut controllers = Vec::new();
    if let Some(a) = traddr {
        controllers.push((
            a.to_string(),
            trsvcid.unwrap_or(DISCOVERY_PORT),
            hostnqn.map(str::to_string),
        ));
    } else {
        let file = config.map_or_else(|| home.discovery_conf_path(), Path::to_path_buf);
        let text = std::fs::read_to_string(&file).with_context(|| {
            format!(
                "cannot read {}; list discovery controllers there (one \
                 `--transport=tcp --traddr=ADDR --trsvcid=8009` per line) or give -a",
                file.display()
            )
        })?;
        for (i, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if !line.is_empty() {
                controllers.push(parse_discovery_line(line, i + 1, &file)?);
            }
        }
    }
    let mut specs = Vec::new();
    for (a, s, q) in &controllers {
        let addr = resolve(a, *s)?;
        for r in discover_records(home, addr, q.as_deref())? {
            if r.subtype != "nvme subsystem" {
                continue;
            }
            let port: u16 = r.trsvcid.trim().parse().map_err(|_| {
                anyhow!(
                    "discovery at {addr}: entry for {} has trsvcid {:?}",
                    r.subnqn,
                    r.trsvcid
                )
            })?;
            let io_addr = resolve(r.traddr.trim(), port)?;
            specs.push(spec(io_addr, &r.subnqn, q.as_deref(), t)?);
        }
    }
    if specs.is_empty() {
        bail!("the discovery controllers list no subsystem this host may connect to");
    }
    connect_specs(home, specs)
}

pub fn disconnect(
    home: &Home,
    nqn: Option<&str>,
    traddr: Option<&str>,
    trsvcid: Option<u16>,
) -> Result<()> {
    let traddr = match traddr {
        Some(a) => Some(resolve(a, trsvcid.unwrap_or(IO_PORT))?.to_string()),
        None => None,
    };
    let request = Request::NvmeDisconnect {
        subnqn: nqn.map(str::to_string),
        traddr,
    };
    match call(home, &request)? {
        Reply::NvmeDisconnected(n) => {
            match nqn {
                Some(nqn) => println!("NQN:{nqn} disconnected {n} controller(s)"),
                None => println!("disconnected {n} controller(s)"),
            }
            Ok(())
        }
        other => Err(unexpected(other)),
    }
}

pub fn list(home: &Home, machine: bool) -> Result<()> {
    let rows = match call(home, &Request::NvmeList)? {
        Reply::NvmeNamespaces(rows) => rows,
        other => return Err(unexpected(other)),
    };
    if machine {
        print_list_y(&rows);
    } else if rows.is_empty() {
        println!(
            "no NVMe/TCP namespaces; connect with `tessera nvme connect -t tcp -a ADDR -n NQN`"
        );
    } else {
        print_list(&rows);
    }
    Ok(())
}

fn print_list_y(rows: &[NvmeNamespaceRow]) {
    let y = YRecord::new("nvme", "");
    println!(
        "{}",
        y.header(&[
            "namespace",
            "sizeBytes",
            "nsid",
            "subnqn",
            "nguid",
            "controller",
            "traddr",
            "cntlid",
            "anaState",
            "state",
            "commands",
            "bytes",
            "errors",
            "retries",
            "latencyUsP50",
            "latencyUsP99",
            "id",
        ])
    );
    for r in rows {
        for p in &r.paths {
            println!(
                "{}",
                y.data(&[
                    r.name.clone(),
                    r.size_bytes.to_string(),
                    r.nsid.to_string(),
                    r.subnqn.clone(),
                    r.nguid.clone(),
                    p.controller.clone(),
                    p.traddr.clone(),
                    p.cntlid.to_string(),
                    p.ana_state.clone(),
                    p.state.clone(),
                    p.commands.to_string(),
                    p.bytes.to_string(),
                    p.errors.to_string(),
                    p.retries.to_string(),
                    p.latency_us_p50.to_string(),
                    p.latency_us_p99.to_string(),
                    r.id.clone(),
                ])
            );
        }
    }
}

/// One row per path, the namespace's columns on its first path only, as `multipath -ll`
/// groups paths under their device.
fn print_list(rows: &[NvmeNamespaceRow]) {
    let mut table = Table::new(&[
        "namespace",
        "id",
        "size",
        "nsid",
        "subsystem",
        "path",
        "address",
        "cntlid",
        "ana state",
        "state",
        "commands",
        "errors",
        "p99 us",
    ])
    .right(&[2, 3, 7, 10, 11, 12]);
    for r in rows {
        if r.paths.is_empty() {
            table.row(vec![
                r.name.clone(),
                r.id.clone(),
                format_bytes(r.size_bytes),
                r.nsid.to_string(),
                r.subnqn.clone(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "no path".into(),
                "0".into(),
                "0".into(),
                "-".into(),
            ]);
        }
        for (i, p) in r.paths.iter().enumerate() {
            let first = i == 0;
            let cell = |s: String| if first { s } else { String::new() };
            table.row(vec![
                cell(r.name.clone()),
                cell(r.id.clone()),
                cell(format_bytes(r.size_bytes)),
                cell(r.nsid.to_string()),
                cell(r.subnqn.clone()),
                p.controller.clone(),
                p.traddr.clone(),
                p.cntlid.to_string(),
                p.ana_state.clone(),
                p.state.clone(),
                p.commands.to_string(),
                p.errors.to_string(),
                p.latency_us_p99.to_string(),
            ]);
        }
    }
    print!("{}", table.render());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_errors_name_the_address_once() {
        let addr: SocketAddr = "127.0.0.2:8009".parse().unwrap();
        let e = discovery_error(addr, "127.0.0.2:8009: transport error: connecting: refused");
        assert_eq!(
            e,
            "discovery at 127.0.0.2:8009: transport error: connecting: refused"
        );
        let e = discovery_error(addr, "the subsystem refused host nqn.x");
        assert_eq!(
            e,
            "discovery at 127.0.0.2:8009: the subsystem refused host nqn.x"
        );
    }

    #[test]
    fn discovery_conf_lines_take_both_option_forms() {
        let f = Path::new("discovery.conf");
        let (a, s, q) =
            parse_discovery_line("--transport=tcp --traddr=10.0.0.1 --trsvcid=4420", 1, f).unwrap();
        assert_eq!((a.as_str(), s, q), ("10.0.0.1", 4420, None));
        let (a, s, _) = parse_discovery_line("-t tcp -a 10.0.0.2", 2, f).unwrap();
        assert_eq!((a.as_str(), s), ("10.0.0.2", DISCOVERY_PORT));
        let e = parse_discovery_line("-t rdma -a 10.0.0.2", 3, f).unwrap_err();
        assert!(e.to_string().contains("discovery.conf:3"), "{e}");
        let e = parse_discovery_line("--trsvcid=x --traddr=a", 4, f).unwrap_err();
        assert!(e.to_string().contains("not a TCP port"), "{e}");
        assert!(parse_discovery_line("-t tcp", 5, f)
            .unwrap_err()
            .to_string()
            .contains("no --traddr"));
    }
}
