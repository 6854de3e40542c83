//! Configuration parameters set with `tessera config set` [mmchconfig] and listed with
//! `tessera config ls` [mmlsconfig].
//!
//! Only parameters that Tessera implements are known; any other name is refused with the
//! list of known ones, so a GPFS habit such as `maxMBpS=` is never silently ignored.
//! Values are validated and stored normalized, so every node reads the same text.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::node::NodeNumber;

/// Whether a parameter may differ between nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// One value for the whole cluster: `-N` is refused.
    Cluster,
    /// A cluster default with optional per-node values (`-N`).
    Node,
}

/// A parameter Tessera knows.
pub struct ParamSpec {
    pub name: &'static str,
    pub default: &'static str,
    pub scope: Scope,
    pub help: &'static str,
    /// Checks a value and returns it normalized.
    pub check: fn(&str) -> Result<String, String>,
}

/// Every known parameter.
pub const PARAMS: &[ParamSpec] = &[
    ParamSpec {
        name: "failureDetectionTime",
        default: "35",
        scope: Scope::Cluster,
        help: "seconds until a node that stopped renewing its disk lease is expelled; \
               also the lease length",
        check: |v| check_seconds(v, 0.5, 300.0),
    },
    ParamSpec {
        name: "leaseRecoveryWait",
        default: "35",
        scope: Scope::Cluster,
        help: "seconds to wait after an expel before the node's work is recovered, so \
               its in-flight I/O has drained",
        check: |v| check_seconds(v, 0.0, 300.0),
    },
    ParamSpec {
        name: "maxFilesToCache",
        default: "50000",
        scope: Scope::Node,
        help: "inodes whose whole record (attributes, inline data, content) a node keeps \
               in memory per mounted file system; takes effect at the next mount",
        check: |v| check_count(v, 1, 100_000_000),
    },
    ParamSpec {
        name: "maxStatCache",
        default: "100000",
        scope: Scope::Node,
        help: "further inodes whose attributes alone a node keeps in memory (for stat \
               and ls -l); 0 turns it off; takes effect at the next mount",
        check: |v| check_count(v, 0, 100_000_000),
    },
    ParamSpec {
        name: "pagepool",
        default: "1G",
        scope: Scope::Node,
        help: "memory for metadata pages (directory, inode and block-map pages) a node \
               keeps per mounted file system, clean and changed together (changes are \
               written back from a quarter of it, and wait at half); unlike GPFS's, file \
               data is not cached in it (the kernel's page cache holds that); takes effect \
               at the next mount",
        check: |v| check_bytes(v, 16 << 20, 1 << 40),
    },
    ParamSpec {
        name: "metricsAddress",
        default: "no",
        scope: Scope::Node,
        help: "where the node daemon serves Prometheus metrics over HTTP (`/metrics`), as \
               IP:PORT (`127.0.0.1:9710` for this host only, `0.0.0.0:9710` for the \
               network), or `no`; read-only; takes effect at the next startup",
        check: check_listen_address,
    },
    ParamSpec {
        name: "useNSDserver",
        default: "asneeded",
        scope: Scope::Node,
        help: "how this node reaches an NSD that has NSD servers (`servers=` in its \
               stanza): `always` through the servers, `never` only directly (a disk the \
               node cannot open is missing), `asfound` directly when the node can open the \
               disk at mount, else through the servers, `asneeded` the same and, when the \
               direct path fails under a mounted file system, through the servers from \
               then on; also a mount option (`mount -o useNSDserver=...`); takes effect \
               at the next mount",
        check: check_use_nsd_server,
    },
    ParamSpec {
        name: "nsdServerPort",
        default: "1192",
        scope: Scope::Node,
        help: "TCP port on which an NSD server serves its NSDs (NVMe/TCP, one subsystem \
               per NSD) at its node address; other nodes read it from the configuration; \
               takes effect at the server's next startup",
        check: |v| check_count(v, 1, 65535),
    },
    ParamSpec {
        name: "nsdServerWaitTime",
        default: "60",
        scope: Scope::Node,
        help: "seconds an I/O to an NSD waits while none of its NSD servers answers \
               before it fails to the application with an I/O error naming the servers \
               (the paths keep reconnecting, and I/O works again as soon as a server \
               returns); takes effect for paths connected after the change (at the next \
               mount)",
        check: |v| check_seconds(v, 1.0, 3600.0),
    },
    ParamSpec {
        name: "nsdServerWaitTimeForMount",
        default: "300",
        scope: Scope::Node,
        help: "seconds a file system that a node mounts again at its daemon's start keeps \
               being tried while none of the servers of one of its NSDs is up (nodes \
               starting together: a client before its NSD servers); 0 gives up at the \
               first failure",
        check: |v| check_seconds(v, 0.0, 1200.0),
    },
    ParamSpec {
        name: "metadataSlots",
        default: "yes",
        scope: Scope::Cluster,
        help: "`yes` (the default): a node that mounts a file system beside its file \
               system manager asks for an owner slot of its own (a log, a record and a \
               free allocation region; without a wholly free region it mounts as a plain \
               client) and owns the directories it makes in directories others serve, \
               and everything made in them, so that metadata work in them stays on that \
               node (mdtest's directory per process); a slot whose holder dies or \
               unmounts is taken over by the first node that needs it. Renames, links and \
               directory moves between directories different nodes own go in durable \
               steps at each (a crash between them can leave a link count or a second \
               name of a directory, which fsck repairs); RENAME_EXCHANGE between them \
               fails with EXDEV. `no`: the manager owns all metadata. Takes effect at the \
               next mount",
        check: check_yes_no,
    },
    ParamSpec {
        name: "readReplicaPolicy",
        default: "default",
        scope: Scope::Node,
        help: "which copy of a replicated data block (`fs create -r 2|3`) a node reads: \
               `default` the first copy whose disk is up, `local` a copy on a disk the \
               node reaches itself before one it reaches through NSD servers, `fastest` \
               the copy whose disk answered reads fastest lately (every copy is tried now \
               and then, so a disk that became faster is found); each falls back to the \
               next copy on an error or a checksum mismatch; takes effect at the next mount",
        check: check_read_replica_policy,
    },
];

fn check_yes_no(value: &str) -> Result<String, String> {
    match value.trim().to_ascii_lowercase().as_str() {
        "yes" => Ok("yes".into()),
        "no" => Ok("no".into()),
        _ => Err(format!("`{value}` is not yes or no")),
    }
}

/// The values of `readReplicaPolicy`, as GPFS spells them.
pub const READ_REPLICA_POLICIES: [&str; 3] = ["default", "local", "fastest"];

fn check_read_replica_policy(value: &str) -> Result<String, String> {
    let v = value.trim().to_ascii_lowercase();
    if READ_REPLICA_POLICIES.contains(&v.as_str()) {
        Ok(v)
    } else {
        Err(format!("use one of {}", READ_REPLICA_POLICIES.join(", ")))
    }
}

/// The values of `useNSDserver`, as GPFS spells them.
pub const USE_NSD_SERVER: [&str; 4] = ["always", "asfound", "asneeded", "never"];

fn check_use_nsd_server(value: &str) -> Result<String, String> {
    let v = value.trim().to_ascii_lowercase();
    if USE_NSD_SERVER.contains(&v.as_str()) {
        Ok(v)
    } else {
        Err(format!(
            "`{value}` is not one of {}",
            USE_NSD_SERVER.join(", ")
        ))
    }
}

/// `no`, or an IP address and a port (a name would resolve differently on each node).
fn check_listen_address(value: &str) -> Result<String, String> {
    let v = value.trim();
    if v.eq_ignore_ascii_case("no") {
        return Ok("no".into());
    }
    let addr: std::net::SocketAddr = v
        .parse()
        .map_err(|_| format!("`{value}` is not IP:PORT (for example 127.0.0.1:9710) nor `no`"))?;
    if addr.port() == 0 {
        return Err(format!(
            "`{value}` names port 0; a scraper needs a fixed port (for example 9710)"
        ));
    }
    Ok(addr.to_string())
}

/// A size in bytes within `min..=max`, with an optional binary unit (`K`, `M`, `G`, `T`),
/// normalized to the largest unit that divides it (`536870912` and `512M` give `512M`).
fn check_bytes(value: &str, min: u64, max: u64) -> Result<String, String> {
    let n =
        parse_bytes(value).ok_or_else(|| format!("`{value}` is not a size (like 512M or 4G)"))?;
    if !(min..=max).contains(&n) {
        return Err(format!(
            "{} is outside {} to {}",
            format_bytes(n),
            format_bytes(min),
            format_bytes(max)
        ));
    }
    Ok(format_bytes(n))
}

fn parse_bytes(value: &str) -> Option<u64> {
    let v = value.trim();
    let (digits, shift) = match v.chars().last()?.to_ascii_uppercase() {
        'K' => (&v[..v.len() - 1], 10),
        'M' => (&v[..v.len() - 1], 20),
        'G' => (&v[..v.len() - 1], 30),
        'T' => (&v[..v.len() - 1], 40),
        _ => (v, 0),
    };
    digits.parse::<u64>().ok()?.checked_mul(1u64 << shift)
}

fn format_bytes(n: u64) -> String {
    for (shift, unit) in [(40, 'T'), (30, 'G'), (20, 'M'), (10, 'K')] {
        if n >= 1 << shift && n.is_multiple_of(1 << shift) {
            return format!("{}{unit}", n >> shift);
        }
    }
    n.to_string()
}

/// A whole number within `min..=max`, normalized (`50000`; `50k` and `1M` accepted).
fn check_count(value: &str, min: u64, max: u64) -> Result<String, String> {
    let v = value.trim();
    let (digits, unit) = match v.char_indices().last() {
        Some((i, c)) if c.eq_ignore_ascii_case(&'k') => (&v[..i], 1_000),
        Some((i, c)) if c.eq_ignore_ascii_case(&'m') => (&v[..i], 1_000_000),
        _ => (v, 1),
    };
    let n = digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(unit))
        .ok_or_else(|| format!("`{value}` is not a whole number"))?;
    if !(min..=max).contains(&n) {
        return Err(format!("{n} is outside {min} to {max}"));
    }
    Ok(n.to_string())
}

/// The spec of a known parameter; unknown names get the list of known ones.
pub fn spec(name: &str) -> Result<&'static ParamSpec, String> {
    if name == "tiebreakerDisks" {
        return Err(
            "node quorum with tiebreaker disks is not implemented yet; define three \
                    (or five) quorum nodes so that a majority survives a node failure"
                .into(),
        );
    }
    PARAMS.iter().find(|p| p.name == name).ok_or_else(|| {
        let known: Vec<&str> = PARAMS.iter().map(|p| p.name).collect();
        format!(
            "unknown configuration parameter `{name}`; Tessera implements: {}",
            known.join(", ")
        )
    })
}

/// Seconds with up to three decimals (`35`, `2.5`), normalized without trailing zeros.
fn check_seconds(value: &str, min: f64, max: f64) -> Result<String, String> {
    let seconds: f64 = value
        .parse()
        .ok()
        .filter(|s: &f64| s.is_finite())
        .ok_or_else(|| format!("`{value}` is not a number of seconds"))?;
    if !(min..=max).contains(&seconds) {
        return Err(format!("{value} is outside {min} to {max} seconds"));
    }
    let millis = (seconds * 1000.0).round() as u64;
    Ok(format_millis(millis))
}

fn format_millis(millis: u64) -> String {
    if millis.is_multiple_of(1000) {
        (millis / 1000).to_string()
    } else {
        let text = format!("{}.{:03}", millis / 1000, millis % 1000);
        text.trim_end_matches('0').to_string()
    }
}

fn parse_seconds(value: &str) -> Duration {
    Duration::from_secs_f64(value.parse::<f64>().unwrap_or(0.0))
}

/// The parameters in force: cluster-wide values and per-node overrides; defaults are not
/// stored, so a changed default reaches every cluster that never set the parameter.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Params {
    pub cluster: BTreeMap<String, String>,
    pub per_node: BTreeMap<NodeNumber, BTreeMap<String, String>>,
}

impl Params {
    /// The value in force on `node` (its own, else the cluster's, else the default).
    pub fn get(&self, name: &str, node: Option<NodeNumber>) -> String {
        let own = node
            .and_then(|n| self.per_node.get(&n))
            .and_then(|m| m.get(name));
        if let Some(v) = own.or_else(|| self.cluster.get(name)) {
            return v.clone();
        }
        PARAMS
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.default.to_string())
            .unwrap_or_default()
    }

    /// A size parameter in force on `node`, in bytes.
    pub fn bytes(&self, name: &str, node: Option<NodeNumber>) -> u64 {
        parse_bytes(&self.get(name, node)).unwrap_or(0)
    }

    /// A count parameter in force on `node`.
    pub fn count(&self, name: &str, node: Option<NodeNumber>) -> u64 {
        self.get(name, node).parse().unwrap_or(0)
    }

    /// A time parameter in force on `node`.
    pub fn seconds(&self, name: &str, node: Option<NodeNumber>) -> Duration {
        parse_seconds(&self.get(name, node))
    }

    /// The disk-lease and failure-detection timings.
    pub fn lease_timings(&self) -> LeaseTimings {
        LeaseTimings::new(
            parse_seconds(&self.get("failureDetectionTime", None)),
            parse_seconds(&self.get("leaseRecoveryWait", None)),
        )
    }
}

/// One `NAME=VALUE` of a `config set`, checked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParamChange {
    pub name: String,
    /// Normalized value; `DEFAULT` (GPFS's word) removes the setting.
    pub value: Option<String>,
}

/// Parses `NAME=VALUE[,NAME=VALUE...]` and checks every name, value and scope against
/// whether `-N` was given. Nothing is returned unless everything is valid.
pub fn parse_changes(text: &str, per_node: bool) -> Result<Vec<ParamChange>, String> {
    let mut changes = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, value) = item
            .split_once('=')
            .ok_or_else(|| format!("`{item}`: expected NAME=VALUE"))?;
        let spec = spec(name.trim())?;
        if per_node && spec.scope == Scope::Cluster {
            return Err(format!(
                "{} is one value for the whole cluster; set it without -N",
                spec.name
            ));
        }
        let value = value.trim();
        let value = if value.eq_ignore_ascii_case("DEFAULT") {
            None
        } else {
            Some((spec.check)(value).map_err(|e| format!("{}: {e}", spec.name))?)
        };
        changes.push(ParamChange {
            name: spec.name.to_string(),
            value,
        });
    }
    if changes.is_empty() {
        return Err("no NAME=VALUE given".into());
    }
    Ok(changes)
}

/// Disk-lease timings, all derived from the two parameters so that an admin tunes
/// failure detection with one number, as in GPFS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseTimings {
    /// How long a grant lasts, measured by the node from when it *sent* the renewal.
    pub lease: Duration,
    /// How often a node renews: a quarter of the lease, so three renewals can be lost
    /// before the lease runs out.
    pub renew_every: Duration,
    /// How long the manager waits after a node's last renewal before expelling it.
    pub failure_detection: Duration,
    /// How long after an expel the node's work may be recovered by others.
    pub recovery_wait: Duration,
}

impl LeaseTimings {
    pub fn new(failure_detection: Duration, recovery_wait: Duration) -> LeaseTimings {
        assert!(failure_detection > Duration::ZERO);
        LeaseTimings {
            lease: failure_detection,
            renew_every: failure_detection / 4,
            failure_detection,
            recovery_wait,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_names_list_the_known_ones() {
        let e = parse_changes("maxMBpS=4000", false).unwrap_err();
        assert!(
            e.contains("unknown configuration parameter `maxMBpS`"),
            "{e}"
        );
        assert!(e.contains("failureDetectionTime"), "{e}");
    }

    #[test]
    fn values_are_checked_and_normalized() {
        let c = parse_changes("failureDetectionTime=2.50, leaseRecoveryWait=0", false).unwrap();
        assert_eq!(c[0].value.as_deref(), Some("2.5"));
        assert_eq!(c[1].value.as_deref(), Some("0"));
        let e = parse_changes("failureDetectionTime=abc", false).unwrap_err();
        assert!(e.contains("not a number of seconds"), "{e}");
        let e = parse_changes("failureDetectionTime=1000", false).unwrap_err();
        assert!(e.contains("outside"), "{e}");
        let e = parse_changes("failureDetectionTime=NaN", false).unwrap_err();
        assert!(e.contains("not a number"), "{e}");
        assert!(parse_changes("failureDetectionTime", false).is_err());
    }

    #[test]
    fn cache_sizes_are_counts_per_node() {
        let c = parse_changes("maxFilesToCache=200k,maxStatCache=0", true).unwrap();
        assert_eq!(c[0].value.as_deref(), Some("200000"));
        assert_eq!(c[1].value.as_deref(), Some("0"));
        let e = parse_changes("maxFilesToCache=0", false).unwrap_err();
        assert!(e.contains("outside 1"), "{e}");
        let e = parse_changes("maxStatCache=lots", false).unwrap_err();
        assert!(e.contains("not a whole number"), "{e}");
        let mut p = Params::default();
        assert_eq!(p.count("maxFilesToCache", Some(2)), 50_000);
        p.per_node
            .entry(2)
            .or_default()
            .insert("maxFilesToCache".into(), "7".into());
        assert_eq!(p.count("maxFilesToCache", Some(2)), 7);
        assert_eq!(p.count("maxFilesToCache", Some(3)), 50_000);
    }

    #[test]
    fn read_replica_policy_is_default_local_or_fastest() {
        let c = parse_changes("readReplicaPolicy=Fastest", true).unwrap();
        assert_eq!(c[0].value.as_deref(), Some("fastest"));
        assert_eq!(
            Params::default().get("readReplicaPolicy", Some(1)),
            "default"
        );
        let c = parse_changes("readReplicaPolicy=local", false).unwrap();
        assert_eq!(c[0].value.as_deref(), Some("local"));
        let e = parse_changes("readReplicaPolicy=nearest", false).unwrap_err();
        assert!(e.contains("default, local, fastest"), "{e}");
    }

    #[test]
    fn metrics_address_is_ip_port_or_no() {
        let c = parse_changes("metricsAddress=127.0.0.1:9710", true).unwrap();
        assert_eq!(c[0].value.as_deref(), Some("127.0.0.1:9710"));
        let c = parse_changes("metricsAddress=NO", false).unwrap();
        assert_eq!(c[0].value.as_deref(), Some("no"));
        assert_eq!(Params::default().get("metricsAddress", Some(1)), "no");
        for bad in ["localhost:9710", "127.0.0.1", "127.0.0.1:0", "9710", ""] {
            let e = parse_changes(&format!("metricsAddress={bad}"), false).unwrap_err();
            assert!(e.contains("metricsAddress"), "{bad}: {e}");
        }
    }

    #[test]
    fn pagepool_is_a_size_per_node() {
        let c = parse_changes("pagepool=1024M", true).unwrap();
        assert_eq!(c[0].value.as_deref(), Some("1G"));
        let c = parse_changes("pagepool=536870912", false).unwrap();
        assert_eq!(c[0].value.as_deref(), Some("512M"));
        let c = parse_changes("pagepool=100000k", false).unwrap();
        assert_eq!(c[0].value.as_deref(), Some("100000K"));
        let e = parse_changes("pagepool=1M", false).unwrap_err();
        assert!(e.contains("1M is outside 16M to 1T"), "{e}");
        let e = parse_changes("pagepool=lots", false).unwrap_err();
        assert!(e.contains("not a size"), "{e}");
        assert!(parse_changes("pagepool=99999999999T", false).is_err());
        let mut p = Params::default();
        assert_eq!(p.bytes("pagepool", Some(1)), 1 << 30);
        p.cluster.insert("pagepool".into(), "2G".into());
        assert_eq!(p.bytes("pagepool", Some(1)), 2 << 30);
    }

    #[test]
    fn tiebreaker_disks_are_refused_with_what_to_do_instead() {
        let e = parse_changes("tiebreakerDisks=nsd1", false).unwrap_err();
        assert!(e.contains("three"), "{e}");
    }

    #[test]
    fn cluster_wide_parameters_refuse_dash_n() {
        let e = parse_changes("failureDetectionTime=10", true).unwrap_err();
        assert!(e.contains("without -N"), "{e}");
    }

    #[test]
    fn use_nsd_server_takes_gpfs_words_only() {
        let c = parse_changes("useNSDserver=Always", true).unwrap();
        assert_eq!(c[0].value.as_deref(), Some("always"));
        let e = parse_changes("useNSDserver=sometimes", true).unwrap_err();
        assert!(e.contains("always, asfound, asneeded, never"), "{e}");
        assert_eq!(Params::default().get("useNSDserver", Some(2)), "asneeded");
        let e = parse_changes("nsdServerPort=0", false).unwrap_err();
        assert!(e.contains("nsdServerPort"), "{e}");
    }

    #[test]
    fn get_falls_back_to_cluster_then_default() {
        let mut p = Params::default();
        assert_eq!(p.get("failureDetectionTime", Some(3)), "35");
        p.cluster.insert("failureDetectionTime".into(), "2".into());
        assert_eq!(p.get("failureDetectionTime", Some(3)), "2");
        let t = p.lease_timings();
        assert_eq!(t.lease, Duration::from_secs(2));
        assert_eq!(t.renew_every, Duration::from_millis(500));
        assert_eq!(t.recovery_wait, Duration::from_secs(35));
    }
}
