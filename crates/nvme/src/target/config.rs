//! The drive server's configuration: JSON in the shape of `nvmetcli saveconfig`, validated
//! completely before anything is opened or bound.
//!
//! Every error names the JSON path of the offending value (`ports[0].addr.trsvcid`) and
//! says what is allowed, because the operator fixes the file by hand. The format is
//! documented in the module documentation of [`super`] and in `crates/nvme/TARGET_CONFIG.md`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use tessera_drive::VolatileCacheConfig;

use crate::wire::log::AnaState;
use crate::wire::text::DISCOVERY_NQN;
use crate::wire::Nqn;

/// The largest NSID a subsystem may use; Identify Controller reports it as NN and MNAN.
pub const NSID_MAX: u32 = 1024;
/// The largest ANA group identifier; Identify Controller reports it as ANAGRPMAX.
pub const ANA_GROUP_MAX: u32 = 128;
/// The default in-capsule data size of an I/O queue (bytes).
pub const INLINE_DATA_DEFAULT_BYTES: u32 = 16 * 1024;
/// The largest in-capsule data size a port may configure (bytes).
pub const INLINE_DATA_MAX_BYTES: u32 = 256 * 1024;

/// Why a configuration was rejected.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{path}: cannot read configuration: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The text is not JSON.
    #[error("configuration is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// A value is missing, unknown or invalid.
    #[error("{path}: {message}")]
    Invalid {
        /// JSON path of the value, for example `subsystems[0].namespaces[1].nsid`.
        path: String,
        /// What is wrong and what is allowed.
        message: String,
    },
}

fn invalid(path: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        path: path.to_owned(),
        message: message.into(),
    }
}

/// A validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetConfig {
    /// Host NQNs that subsystems may list in `allowed_hosts`.
    pub hosts: Vec<Nqn>,
    /// Listening ports, in file order.
    pub ports: Vec<PortConfig>,
    /// NVM subsystems, in file order.
    pub subsystems: Vec<SubsystemConfig>,
    /// Tessera-specific limits.
    pub tessera: Limits,
    /// Where the reservation state of namespaces whose hosts asked for persistence
    /// through power loss (PTPL) is kept (`"tessera": {"state_dir": ...}`); without it
    /// reservations do not survive a restart and PTPL is refused (RESCAP.PTPLC 0).
    pub state_dir: Option<PathBuf>,
}

/// Transport address of a port or referral.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortAddr {
    /// Address family: `ipv4` or `ipv6`.
    pub ipv6: bool,
    /// IP address to listen on.
    pub traddr: IpAddr,
    /// TCP port; 0 picks a free port (see `DriveServer::local_addrs`).
    pub trsvcid: u16,
}

/// One port: an address with the subsystems exported there and its ANA group states.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortConfig {
    /// Port identifier (PORTID in the discovery log).
    pub portid: u16,
    /// Where to listen.
    pub addr: PortAddr,
    /// In-capsule data accepted on I/O queues (bytes); IOCCSZ reports it.
    pub inline_data_bytes: u32,
    /// NQNs of the subsystems exported on this port.
    pub subsystems: Vec<Nqn>,
    /// ANA group states on this port; groups not listed are optimized.
    pub ana_groups: BTreeMap<u32, AnaState>,
    /// Discovery referrals to other ports or servers.
    pub referrals: Vec<Referral>,
}

/// A discovery referral (subtype 1 entry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Referral {
    /// Port identifier reported.
    pub portid: u16,
    /// Address of the referred discovery controller.
    pub addr: PortAddr,
}

/// One NVM subsystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubsystemConfig {
    /// Subsystem NQN.
    pub nqn: Nqn,
    /// Any host may connect.
    pub allow_any_host: bool,
    /// Serial number (SN, at most 20 characters).
    pub serial: String,
    /// Model number (MN, at most 40 characters).
    pub model: String,
    /// Host NQNs allowed to connect when `allow_any_host` is false.
    pub allowed_hosts: Vec<Nqn>,
    /// Namespaces, in file order.
    pub namespaces: Vec<NamespaceConfig>,
}

/// One namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceConfig {
    /// Namespace identifier, 1..=[`NSID_MAX`].
    pub nsid: u32,
    /// Disabled namespaces are validated but not exported.
    pub enable: bool,
    /// Backing file or block device.
    pub path: PathBuf,
    /// NGUID (explicit or derived from the subsystem NQN and NSID).
    pub nguid: [u8; 16],
    /// UUID (explicit or derived).
    pub uuid: [u8; 16],
    /// ANA group, 1..=[`ANA_GROUP_MAX`].
    pub ana_grpid: u32,
    /// Serve the namespace through a volatile write cache that a kill of the server
    /// loses, as a drive loses its cache on power loss (for crash testing).
    pub volatile_write_cache: Option<VolatileCacheConfig>,
}

/// Limits that nvmetcli has no field for (`"tessera": {...}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest keep-alive timeout granted (ms); larger KATO values are reduced to it.
    pub keep_alive_max_ms: u32,
    /// Drive I/O threads per I/O queue: the commands of one queue processed at once.
    pub io_threads_per_queue: u32,
    /// Connections (queues) accepted per port.
    pub max_connections_per_port: u32,
    /// Entries per queue (CAP.MQES + 1).
    pub queue_entries_max: u32,
    /// I/O queues granted per controller (Number of Queues feature).
    pub io_queues_max: u32,
    /// MAXH2CDATA offered in ICResp (bytes), which is also the largest R2T.
    pub maxh2cdata_bytes: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            keep_alive_max_ms: 300_000,
            io_threads_per_queue: 32,
            max_connections_per_port: 1024,
            queue_entries_max: 128,
            io_queues_max: 64,
            maxh2cdata_bytes: 1 << 20,
        }
    }
}

/// What rereading the configuration file changes on a running drive server.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ReloadPlan {
    /// ANA state changes to apply: (portid, grpid, new state).
    pub ana_changes: Vec<(u16, u32, AnaState)>,
    /// Other differences, which take effect only when the drive server is restarted.
    pub needs_restart: Vec<String>,
}

impl TargetConfig {
    /// Compares a running configuration with a newly read one. ANA states can change
    /// live (that is how an array fails its namespaces over between controllers); every
    /// other difference is named in [`ReloadPlan::needs_restart`].
    #[must_use]
    pub fn reload_plan(&self, new: &TargetConfig) -> ReloadPlan {
        let mut plan = ReloadPlan::default();
        let state =
            |p: &PortConfig, g: u32| p.ana_groups.get(&g).copied().unwrap_or(AnaState::Optimized);
        for old_port in &self.ports {
            let Some(new_port) = new.ports.iter().find(|p| p.portid == old_port.portid) else {
                plan.needs_restart
                    .push(format!("port {} removed", old_port.portid));
                continue;
            };
            let groups: BTreeSet<u32> = old_port
                .ana_groups
                .keys()
                .chain(new_port.ana_groups.keys())
                .copied()
                .collect();
            for g in groups {
                if state(old_port, g) != state(new_port, g) {
                    plan.ana_changes
                        .push((old_port.portid, g, state(new_port, g)));
                }
            }
            let same_but_ana = PortConfig {
                ana_groups: old_port.ana_groups.clone(),
                ..new_port.clone()
            };
            if same_but_ana != *old_port {
                plan.needs_restart
                    .push(format!("port {} changed", old_port.portid));
            }
        }
        for p in &new.ports {
            if !self.ports.iter().any(|o| o.portid == p.portid) {
                plan.needs_restart.push(format!("port {} added", p.portid));
            }
        }
        if self.hosts != new.hosts {
            plan.needs_restart.push("hosts changed".to_string());
        }
        if self.subsystems != new.subsystems {
            plan.needs_restart.push("subsystems changed".to_string());
        }
        if self.tessera != new.tessera {
            plan.needs_restart
                .push("\"tessera\" limits changed".to_string());
        }
        if self.state_dir != new.state_dir {
            plan.needs_restart
                .push("\"tessera\".state_dir changed".to_string());
        }
        plan
    }

    /// Reads and validates the configuration file at `path`.
    ///
    /// # Errors
    /// [`ConfigError`] naming the file or the JSON path of the offending value.
    pub fn load(path: &Path) -> Result<TargetConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        TargetConfig::from_json_str(&text)
    }

    /// Parses and validates configuration text.
    ///
    /// # Errors
    /// [`ConfigError`] naming the JSON path of the offending value.
    pub fn from_json_str(text: &str) -> Result<TargetConfig, ConfigError> {
        let value: Value = serde_json::from_str(text)?;
        let root = Obj::new(&value, "")?;
        root.only(&["hosts", "ports", "subsystems", "tessera"])?;
        let hosts = parse_hosts(&root)?;
        let subsystems = root
            .array_opt("subsystems")?
            .iter()
            .map(|(v, path)| parse_subsystem(v, path))
            .collect::<Result<Vec<_>, _>>()?;
        let ports = root
            .array_opt("ports")?
            .iter()
            .map(|(v, path)| parse_port(v, path))
            .collect::<Result<Vec<_>, _>>()?;
        let (tessera, state_dir) = match root.get("tessera") {
            Some(v) => parse_limits(v, "tessera")?,
            None => (Limits::default(), None),
        };
        let config = TargetConfig {
            hosts,
            ports,
            subsystems,
            tessera,
            state_dir,
        };
        config.check_references()?;
        Ok(config)
    }

    /// Cross-references: unique identifiers, ports naming existing subsystems, allowed
    /// hosts declared in `hosts`.
    fn check_references(&self) -> Result<(), ConfigError> {
        let mut nqns = BTreeSet::new();
        for (i, s) in self.subsystems.iter().enumerate() {
            if !nqns.insert(s.nqn.as_str()) {
                let path = format!("subsystems[{i}].nqn");
                return Err(invalid(&path, format!("duplicate subsystem NQN {}", s.nqn)));
            }
            let hosts: BTreeSet<&str> = self.hosts.iter().map(Nqn::as_str).collect();
            for (j, h) in s.allowed_hosts.iter().enumerate() {
                if !hosts.contains(h.as_str()) {
                    let path = format!("subsystems[{i}].allowed_hosts[{j}]");
                    let msg = format!("host {h} is not declared in \"hosts\"");
                    return Err(invalid(&path, msg));
                }
            }
        }
        let mut portids = BTreeSet::new();
        let mut addrs = BTreeSet::new();
        for (i, p) in self.ports.iter().enumerate() {
            if !portids.insert(p.portid) {
                let path = format!("ports[{i}].portid");
                return Err(invalid(&path, format!("duplicate portid {}", p.portid)));
            }
            if p.addr.trsvcid != 0 && !addrs.insert((p.addr.traddr, p.addr.trsvcid)) {
                let path = format!("ports[{i}].addr");
                return Err(invalid(
                    &path,
                    "another port already listens on this address",
                ));
            }
            for (j, nqn) in p.subsystems.iter().enumerate() {
                if !nqns.contains(nqn.as_str()) {
                    let path = format!("ports[{i}].subsystems[{j}]");
                    let msg = format!("subsystem {nqn} is not defined in \"subsystems\"");
                    return Err(invalid(&path, msg));
                }
            }
        }
        Ok(())
    }
}

fn parse_hosts(root: &Obj<'_>) -> Result<Vec<Nqn>, ConfigError> {
    let mut hosts = Vec::new();
    let mut seen = BTreeSet::new();
    for (v, path) in root.array_opt("hosts")? {
        let host = Obj::new(v, &path)?;
        host.only(&["nqn"])?;
        let nqn = host.nqn("nqn")?;
        if !seen.insert(nqn.as_str().to_owned()) {
            return Err(invalid(
                &format!("{path}.nqn"),
                format!("duplicate host {nqn}"),
            ));
        }
        hosts.push(nqn);
    }
    Ok(hosts)
}

fn parse_subsystem(v: &Value, path: &str) -> Result<SubsystemConfig, ConfigError> {
    let o = Obj::new(v, path)?;
    o.only(&["nqn", "attr", "allowed_hosts", "namespaces"])?;
    let nqn = o.nqn("nqn")?;
    if nqn.is_discovery() || nqn.as_str() == DISCOVERY_NQN {
        let msg = "the discovery NQN is built in; choose another subsystem NQN";
        return Err(invalid(&o.at("nqn"), msg));
    }
    let (allow_any_host, serial, model) = parse_attr(&o, &nqn)?;
    let allowed_hosts = o
        .array_opt("allowed_hosts")?
        .iter()
        .map(|(v, p)| parse_nqn_value(v, p))
        .collect::<Result<Vec<_>, _>>()?;
    let mut namespaces: Vec<NamespaceConfig> = Vec::new();
    for (v, p) in o.array_opt("namespaces")? {
        let ns = parse_namespace(v, &p, &nqn)?;
        if namespaces.iter().any(|n| n.nsid == ns.nsid) {
            let msg = format!("duplicate nsid {} in subsystem {nqn}", ns.nsid);
            return Err(invalid(&format!("{p}.nsid"), msg));
        }
        namespaces.push(ns);
    }
    Ok(SubsystemConfig {
        nqn,
        allow_any_host,
        serial,
        model,
        allowed_hosts,
        namespaces,
    })
}

fn parse_attr(o: &Obj<'_>, nqn: &Nqn) -> Result<(bool, String, String), ConfigError> {
    let default_serial = format!("{:016x}", stable_hash64(nqn.as_str().as_bytes(), 0));
    let default_model = "Tessera drive server".to_owned();
    let Some(v) = o.get("attr") else {
        return Ok((false, default_serial, default_model));
    };
    let attr = Obj::new(v, &o.at("attr"))?;
    attr.only(&["allow_any_host", "serial", "model"])?;
    let allow_any_host = attr.flag("allow_any_host", false)?;
    let serial = attr.text("serial", 20)?.unwrap_or(default_serial);
    let model = attr.text("model", 40)?.unwrap_or(default_model);
    Ok((allow_any_host, serial, model))
}

fn parse_namespace(v: &Value, path: &str, subnqn: &Nqn) -> Result<NamespaceConfig, ConfigError> {
    let o = Obj::new(v, path)?;
    o.only(&[
        "nsid",
        "enable",
        "device",
        "ana_grpid",
        "volatile_write_cache",
    ])?;
    let nsid = o
        .number("nsid", 1, u64::from(NSID_MAX))?
        .ok_or_else(|| invalid(&o.at("nsid"), format!("required: a number 1..={NSID_MAX}")))?
        as u32;
    let enable = o.flag("enable", true)?;
    let ana_grpid = o
        .number("ana_grpid", 1, u64::from(ANA_GROUP_MAX))?
        .unwrap_or(1) as u32;
    let device_path = o.at("device");
    let dev = Obj::new(o.get("device").unwrap_or(&Value::Null), &device_path)?;
    dev.only(&["path", "nguid", "uuid"])?;
    let path_text = dev.text("path", 4096)?.filter(|p| !p.is_empty());
    let path = PathBuf::from(path_text.ok_or_else(|| {
        invalid(
            &dev.at("path"),
            "required: the backing file or block device",
        )
    })?);
    let seed = format!("{}\0{nsid}", subnqn.as_str());
    let nguid = match dev.text("nguid", 64)? {
        Some(t) => parse_id128(&t, &dev.at("nguid"))?,
        None => derived_id128(seed.as_bytes(), 0x6e67),
    };
    let uuid = match dev.text("uuid", 64)? {
        Some(t) => parse_id128(&t, &dev.at("uuid"))?,
        None => derived_uuid(seed.as_bytes()),
    };
    Ok(NamespaceConfig {
        nsid,
        enable,
        path,
        nguid,
        uuid,
        ana_grpid,
        volatile_write_cache: parse_volatile_cache(&o, nsid)?,
    })
}

/// `"volatile_write_cache"`: a flag, or an object with the cache's seed and limits.
fn parse_volatile_cache(
    ns: &Obj<'_>,
    nsid: u32,
) -> Result<Option<VolatileCacheConfig>, ConfigError> {
    let key = "volatile_write_cache";
    let defaults = VolatileCacheConfig {
        // Namespaces of one server destage differently unless seeded alike on purpose.
        seed: u64::from(nsid),
        ..VolatileCacheConfig::default()
    };
    let Some(v @ Value::Object(_)) = ns.get(key) else {
        return Ok(ns.flag(key, false)?.then_some(defaults));
    };
    let o = Obj::new(v, &ns.at(key))?;
    o.only(&["seed", "capacity_mib", "early_destage_one_in"])?;
    Ok(Some(VolatileCacheConfig {
        seed: o.number("seed", 0, u64::MAX)?.unwrap_or(defaults.seed),
        capacity_bytes: o
            .number("capacity_mib", 1, 65_536)?
            .map_or(defaults.capacity_bytes, |m| m << 20),
        early_destage_one_in: o
            .number("early_destage_one_in", 0, 1 << 20)?
            .map_or(defaults.early_destage_one_in, |n| n as u32),
    }))
}

fn parse_port(v: &Value, path: &str) -> Result<PortConfig, ConfigError> {
    let o = Obj::new(v, path)?;
    o.only(&[
        "portid",
        "addr",
        "param",
        "subsystems",
        "ana_groups",
        "referrals",
    ])?;
    let portid = o
        .number("portid", 1, u64::from(u16::MAX - 1))?
        .ok_or_else(|| invalid(&o.at("portid"), "required: a number 1..=65534"))?
        as u16;
    let addr = parse_addr(o.get("addr"), &o.at("addr"), true)?;
    let inline_data_bytes = match o.get("param") {
        Some(v) => parse_param(v, &o.at("param"))?,
        None => INLINE_DATA_DEFAULT_BYTES,
    };
    let subsystems = o
        .array_opt("subsystems")?
        .iter()
        .map(|(v, p)| parse_nqn_value(v, p))
        .collect::<Result<Vec<_>, _>>()?;
    let mut ana_groups = BTreeMap::new();
    for (v, p) in o.array_opt("ana_groups")? {
        let (grpid, state) = parse_ana_group(v, &p)?;
        if ana_groups.insert(grpid, state).is_some() {
            return Err(invalid(
                &format!("{p}.grpid"),
                format!("duplicate grpid {grpid}"),
            ));
        }
    }
    let referrals = o
        .array_opt("referrals")?
        .iter()
        .map(|(v, p)| parse_referral(v, p))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(PortConfig {
        portid,
        addr,
        inline_data_bytes,
        subsystems,
        ana_groups,
        referrals,
    })
}

fn parse_param(v: &Value, path: &str) -> Result<u32, ConfigError> {
    let o = Obj::new(v, path)?;
    o.only(&["inline_data_size"])?;
    let bytes = o
        .number("inline_data_size", 0, u64::from(INLINE_DATA_MAX_BYTES))?
        .unwrap_or(u64::from(INLINE_DATA_DEFAULT_BYTES)) as u32;
    if !bytes.is_multiple_of(16) {
        let msg = "must be a multiple of 16 (IOCCSZ counts 16-byte units)";
        return Err(invalid(&o.at("inline_data_size"), msg));
    }
    Ok(bytes)
}

fn parse_addr(v: Option<&Value>, path: &str, listen: bool) -> Result<PortAddr, ConfigError> {
    let o = Obj::new(v.unwrap_or(&Value::Null), path)?;
    o.only(&["trtype", "adrfam", "traddr", "trsvcid", "treq", "tsas"])?;
    let trtype = o.text("trtype", 16)?.unwrap_or_else(|| "tcp".to_owned());
    if trtype != "tcp" {
        return Err(invalid(
            &o.at("trtype"),
            format!("\"{trtype}\": only \"tcp\" is supported"),
        ));
    }
    let adrfam = o.text("adrfam", 16)?.unwrap_or_else(|| "ipv4".to_owned());
    let ipv6 = match adrfam.as_str() {
        "ipv4" => false,
        "ipv6" => true,
        other => {
            let msg = format!("\"{other}\": allowed are \"ipv4\" and \"ipv6\"");
            return Err(invalid(&o.at("adrfam"), msg));
        }
    };
    for (key, allowed) in [
        ("treq", &["not specified", "not required"][..]),
        ("tsas", &["none"][..]),
    ] {
        if let Some(t) = o.text(key, 32)? {
            if !allowed.contains(&t.as_str()) {
                let msg = format!("\"{t}\": allowed are {allowed:?} (no TLS support)");
                return Err(invalid(&o.at(key), msg));
            }
        }
    }
    let traddr_text = o
        .text("traddr", 256)?
        .ok_or_else(|| invalid(&o.at("traddr"), "required: an IP address"))?;
    let traddr: IpAddr = traddr_text.parse().map_err(|_| {
        invalid(
            &o.at("traddr"),
            format!("\"{traddr_text}\" is not an IP address"),
        )
    })?;
    if traddr.is_ipv6() != ipv6 {
        let msg = format!("\"{traddr_text}\" does not match adrfam \"{adrfam}\"");
        return Err(invalid(&o.at("traddr"), msg));
    }
    let trsvcid = o.number("trsvcid", u64::from(!listen), u64::from(u16::MAX))?;
    let trsvcid = trsvcid.ok_or_else(|| {
        invalid(
            &o.at("trsvcid"),
            "required: a TCP port (\"0\" picks a free one)",
        )
    })? as u16;
    Ok(PortAddr {
        ipv6,
        traddr,
        trsvcid,
    })
}

fn parse_ana_group(v: &Value, path: &str) -> Result<(u32, AnaState), ConfigError> {
    let o = Obj::new(v, path)?;
    o.only(&["grpid", "ana"])?;
    let grpid = o
        .number("grpid", 1, u64::from(ANA_GROUP_MAX))?
        .ok_or_else(|| invalid(&o.at("grpid"), format!("required: 1..={ANA_GROUP_MAX}")))?
        as u32;
    let ana = Obj::new(o.get("ana").unwrap_or(&Value::Null), &o.at("ana"))?;
    ana.only(&["state"])?;
    let text = ana
        .text("state", 32)?
        .unwrap_or_else(|| "optimized".to_owned());
    let state = parse_ana_state(&text).ok_or_else(|| {
        let msg = format!("\"{text}\": allowed are {ANA_STATE_NAMES:?}");
        invalid(&ana.at("state"), msg)
    })?;
    Ok((grpid, state))
}

/// The ANA state names of nvmetcli, in state order.
pub const ANA_STATE_NAMES: [&str; 5] = [
    "optimized",
    "non-optimized",
    "inaccessible",
    "persistent-loss",
    "change",
];

/// Parses an nvmetcli ANA state name.
#[must_use]
pub fn parse_ana_state(text: &str) -> Option<AnaState> {
    Some(match text {
        "optimized" => AnaState::Optimized,
        "non-optimized" => AnaState::NonOptimized,
        "inaccessible" => AnaState::Inaccessible,
        "persistent-loss" => AnaState::PersistentLoss,
        "change" => AnaState::Change,
        _ => return None,
    })
}

fn parse_referral(v: &Value, path: &str) -> Result<Referral, ConfigError> {
    let o = Obj::new(v, path)?;
    o.only(&["name", "addr", "portid", "enable"])?;
    let _ = o.text("name", 256)?;
    let _ = o.flag("enable", true)?;
    let portid = o.number("portid", 0, u64::from(u16::MAX))?.unwrap_or(0) as u16;
    let addr = parse_addr(o.get("addr"), &o.at("addr"), false)?;
    Ok(Referral { portid, addr })
}

fn parse_limits(v: &Value, path: &str) -> Result<(Limits, Option<PathBuf>), ConfigError> {
    let o = Obj::new(v, path)?;
    o.only(&[
        "state_dir",
        "keep_alive_max_ms",
        "io_threads_per_queue",
        "max_connections_per_port",
        "queue_entries_max",
        "io_queues_max",
        "maxh2cdata_bytes",
    ])?;
    let d = Limits::default();
    let get = |key: &str, min: u64, max: u64, default: u32| -> Result<u32, ConfigError> {
        Ok(o.number(key, min, max)?.map_or(default, |n| n as u32))
    };
    let limits = Limits {
        keep_alive_max_ms: get("keep_alive_max_ms", 1000, 3_600_000, d.keep_alive_max_ms)?,
        io_threads_per_queue: get("io_threads_per_queue", 1, 256, d.io_threads_per_queue)?,
        max_connections_per_port: get(
            "max_connections_per_port",
            1,
            65_536,
            d.max_connections_per_port,
        )?,
        queue_entries_max: get("queue_entries_max", 2, 1024, d.queue_entries_max)?,
        io_queues_max: get("io_queues_max", 1, 1024, d.io_queues_max)?,
        maxh2cdata_bytes: get("maxh2cdata_bytes", 4096, 16 << 20, d.maxh2cdata_bytes)?,
    };
    if !limits.maxh2cdata_bytes.is_multiple_of(4096) {
        return Err(invalid(
            &o.at("maxh2cdata_bytes"),
            "must be a multiple of 4096",
        ));
    }
    let state_dir = o.text("state_dir", 4096)?.map(PathBuf::from);
    if let Some(dir) = &state_dir {
        if !dir.is_absolute() {
            return Err(invalid(
                &o.at("state_dir"),
                format!(
                    "\"{}\" must be an absolute path (a directory the drive server keeps \
                     reservation state in)",
                    dir.display()
                ),
            ));
        }
    }
    Ok((limits, state_dir))
}

fn parse_nqn_value(v: &Value, path: &str) -> Result<Nqn, ConfigError> {
    let text = v
        .as_str()
        .ok_or_else(|| invalid(path, "must be an NQN string"))?;
    Nqn::new(text).map_err(|e| invalid(path, format!("invalid NQN \"{text}\": {e}")))
}

/// Parses 32 hex digits, dashes allowed anywhere (nvmetcli writes UUID style).
fn parse_id128(text: &str, path: &str) -> Result<[u8; 16], ConfigError> {
    let digits: Vec<u8> = text.bytes().filter(|&b| b != b'-').collect();
    let bad = || {
        invalid(
            path,
            format!("\"{text}\": must be 32 hex digits (dashes allowed)"),
        )
    };
    if digits.len() != 32 {
        return Err(bad());
    }
    let mut out = [0u8; 16];
    for (i, pair) in digits.chunks_exact(2).enumerate() {
        let s = std::str::from_utf8(pair).map_err(|_| bad())?;
        out[i] = u8::from_str_radix(s, 16).map_err(|_| bad())?;
    }
    Ok(out)
}

/// A 64-bit hash that never changes between releases (FNV-1a), so derived identities
/// stay the same across restarts and on every port.
#[must_use]
pub(crate) fn stable_hash64(bytes: &[u8], seed: u64) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn derived_id128(seed: &[u8], salt: u64) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&stable_hash64(seed, salt).to_be_bytes());
    out[8..].copy_from_slice(&stable_hash64(seed, salt.wrapping_add(1)).to_be_bytes());
    out
}

/// A name-based UUID (RFC 9562 version 8, custom) from `seed`.
fn derived_uuid(seed: &[u8]) -> [u8; 16] {
    let mut out = derived_id128(seed, 0x7575);
    out[6] = (out[6] & 0x0f) | 0x80;
    out[8] = (out[8] & 0x3f) | 0x80;
    out
}

/// A JSON object being validated, with its path for error messages.
struct Obj<'a> {
    map: &'a Map<String, Value>,
    path: String,
}

impl<'a> Obj<'a> {
    fn new(v: &'a Value, path: &str) -> Result<Obj<'a>, ConfigError> {
        let shown = if path.is_empty() { "(top level)" } else { path };
        let map = v
            .as_object()
            .ok_or_else(|| invalid(shown, "must be a JSON object"))?;
        Ok(Obj {
            map,
            path: path.to_owned(),
        })
    }

    fn at(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    fn only(&self, allowed: &[&str]) -> Result<(), ConfigError> {
        match self.map.keys().find(|k| !allowed.contains(&k.as_str())) {
            Some(k) => Err(invalid(
                &self.at(k),
                format!("unknown key; allowed here: {}", allowed.join(", ")),
            )),
            None => Ok(()),
        }
    }

    fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn array_opt(&self, key: &str) -> Result<Vec<(&'a Value, String)>, ConfigError> {
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => Ok(items
                .iter()
                .enumerate()
                .map(|(i, v)| (v, format!("{}[{i}]", self.at(key))))
                .collect()),
            Some(_) => Err(invalid(&self.at(key), "must be a JSON array")),
        }
    }

    /// A string of at most `max` bytes.
    fn text(&self, key: &str, max: usize) -> Result<Option<String>, ConfigError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let s = v
            .as_str()
            .ok_or_else(|| invalid(&self.at(key), "must be a string"))?;
        if s.len() > max || s.bytes().any(|b| !(0x20..=0x7e).contains(&b)) {
            let msg = format!("must be printable ASCII of at most {max} characters");
            return Err(invalid(&self.at(key), msg));
        }
        Ok(Some(s.to_owned()))
    }

    /// A number, given as a JSON number or a decimal string (nvmetcli writes both).
    fn number(&self, key: &str, min: u64, max: u64) -> Result<Option<u64>, ConfigError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let n = match v {
            Value::Number(n) => n.as_u64(),
            Value::String(s) => s.trim().parse::<u64>().ok(),
            _ => None,
        };
        match n {
            Some(n) if (min..=max).contains(&n) => Ok(Some(n)),
            _ => Err(invalid(
                &self.at(key),
                format!("{v}: must be a number {min}..={max}"),
            )),
        }
    }

    /// A flag: 0 or 1, as a number, a string or a boolean.
    fn flag(&self, key: &str, default: bool) -> Result<bool, ConfigError> {
        match self.get(key) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Ok(self.number(key, 0, 1)? == Some(1)),
        }
    }

    fn nqn(&self, key: &str) -> Result<Nqn, ConfigError> {
        let v = self
            .get(key)
            .ok_or_else(|| invalid(&self.at(key), "required: an NQN string"))?;
        parse_nqn_value(v, &self.at(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{
      "hosts": [{"nqn": "nqn.2024-01.io.tessera:host1"}],
      "ports": [{"portid": 1,
                 "addr": {"trtype": "tcp", "adrfam": "ipv4", "traddr": "127.0.0.1",
                          "trsvcid": "0"},
                 "param": {"inline_data_size": "8192"},
                 "subsystems": ["nqn.2024-01.io.tessera:d1"],
                 "ana_groups": [{"grpid": 1, "ana": {"state": "optimized"}},
                                {"grpid": 2, "ana": {"state": "non-optimized"}}],
                 "referrals": []}],
      "subsystems": [{"nqn": "nqn.2024-01.io.tessera:d1",
                      "attr": {"allow_any_host": "0", "serial": "S1"},
                      "allowed_hosts": ["nqn.2024-01.io.tessera:host1"],
                      "namespaces": [{"nsid": 1, "enable": 1,
                                      "device": {"path": "/tmp/x"}, "ana_grpid": 2}]}]
    }"#;

    #[test]
    fn reload_plan_applies_ana_states_and_names_the_rest() {
        let running = TargetConfig::from_json_str(GOOD).unwrap();
        assert_eq!(running.reload_plan(&running.clone()), ReloadPlan::default());

        // Swap the two groups' states, and drop group 1 (unlisted means optimized).
        let failover = GOOD
            .replace(r#"{"grpid": 1, "ana": {"state": "optimized"}},"#, "")
            .replace(r#""state": "non-optimized""#, r#""state": "inaccessible""#);
        let plan = running.reload_plan(&TargetConfig::from_json_str(&failover).unwrap());
        assert_eq!(plan.ana_changes, vec![(1, 2, AnaState::Inaccessible)]);
        assert!(plan.needs_restart.is_empty(), "{:?}", plan.needs_restart);

        let moved = GOOD
            .replace(r#""serial": "S1""#, r#""serial": "S2""#)
            .replace(
                r#""inline_data_size": "8192""#,
                r#""inline_data_size": "4096""#,
            );
        let plan = running.reload_plan(&TargetConfig::from_json_str(&moved).unwrap());
        assert!(plan.ana_changes.is_empty());
        assert_eq!(
            plan.needs_restart,
            vec!["port 1 changed", "subsystems changed"]
        );
    }

    #[test]
    fn parses_nvmetcli_shape() {
        let c = TargetConfig::from_json_str(GOOD).unwrap();
        assert_eq!(c.ports[0].inline_data_bytes, 8192);
        assert_eq!(c.ports[0].ana_groups[&2], AnaState::NonOptimized);
        let ns = &c.subsystems[0].namespaces[0];
        assert_eq!((ns.nsid, ns.ana_grpid), (1, 2));
        let again = TargetConfig::from_json_str(GOOD).unwrap();
        assert_eq!(again.subsystems[0].namespaces[0].nguid, ns.nguid);
        assert_ne!(ns.nguid, [0; 16]);
    }

    fn err(text: &str) -> String {
        TargetConfig::from_json_str(text).unwrap_err().to_string()
    }

    #[test]
    fn errors_name_the_path() {
        let e = err(&GOOD.replace("\"param\"", "\"parm\""));
        assert!(
            e.contains("ports[0].parm: unknown key; allowed here: portid"),
            "{e}"
        );
        let e = err(&GOOD.replace("\"nsid\": 1", "\"nsid\": 0"));
        assert!(e.contains("subsystems[0].namespaces[0].nsid"), "{e}");
        let e = err(&GOOD.replace("\"non-optimized\"", "\"fast\""));
        assert!(e.contains("ports[0].ana_groups[1].ana.state") && e.contains("non-optimized"));
        let e = err(&GOOD.replace("\"subsystems\": [\"nqn", "\"subsystems\": [\"nqn.x"));
        assert!(e.contains("ports[0].subsystems[0]"), "{e}");
        let e = err(&GOOD.replace("nqn.2024-01.io.tessera:host1\"]", "nqn.2024-01.io.t:h\"]"));
        assert!(
            e.contains("allowed_hosts[0]") && e.contains("not declared"),
            "{e}"
        );
        let e = err(&GOOD.replace("\"nqn\": \"nqn.2024-01.io.tessera:d1\"", "\"nqn\": \"bad\""));
        assert!(e.contains("subsystems[0].nqn: invalid NQN"), "{e}");
    }

    #[test]
    fn state_dir_is_an_absolute_path_and_needs_a_restart() {
        let with = |dir: &str| {
            GOOD.trim_end().trim_end_matches('}').to_owned()
                + &format!(r#", "tessera": {{"state_dir": "{dir}"}}}}"#)
        };
        let running = TargetConfig::from_json_str(GOOD).unwrap();
        assert_eq!(running.state_dir, None);
        let c = TargetConfig::from_json_str(&with("/var/lib/tessera/resv")).unwrap();
        assert_eq!(c.state_dir, Some(PathBuf::from("/var/lib/tessera/resv")));
        assert_eq!(
            running.reload_plan(&c).needs_restart,
            vec!["\"tessera\".state_dir changed"]
        );
        let e = err(&with("state"));
        assert!(
            e.contains("tessera.state_dir") && e.contains("absolute"),
            "{e}"
        );
    }

    #[test]
    fn volatile_write_cache_is_a_flag_or_an_object_and_typos_are_refused() {
        let with = |v: &str| {
            GOOD.replace(
                r#""ana_grpid": 2}"#,
                &format!(r#""ana_grpid": 2, "volatile_write_cache": {v}}}"#),
            )
        };
        let ns = |t: &str| {
            TargetConfig::from_json_str(t).unwrap().subsystems[0].namespaces[0].volatile_write_cache
        };
        assert_eq!(ns(GOOD), None);
        assert_eq!(ns(&with("false")), None);
        assert_eq!(
            ns(&with("true")),
            Some(VolatileCacheConfig {
                seed: 1,
                ..VolatileCacheConfig::default()
            })
        );
        let c = ns(&with(
            r#"{"seed": 42, "capacity_mib": 8, "early_destage_one_in": 0}"#,
        ));
        assert_eq!(
            c,
            Some(VolatileCacheConfig {
                seed: 42,
                capacity_bytes: 8 << 20,
                early_destage_one_in: 0
            })
        );
        let e = err(&with(r#"{"sead": 1}"#));
        assert!(
            e.contains("namespaces[0].volatile_write_cache.sead: unknown key"),
            "{e}"
        );
        let e = err(&with(r#"{"capacity_mib": 0}"#));
        assert!(e.contains("volatile_write_cache.capacity_mib"), "{e}");
    }
}
