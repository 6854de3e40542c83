//! NVM subsystems and the built-in discovery subsystem: which namespaces, which hosts.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::config::SubsystemConfig;
use super::namespace::Namespace;
use crate::wire::Nqn;

/// A subsystem as the server exports it.
#[derive(Debug)]
pub(crate) struct Subsystem {
    pub nqn: Nqn,
    pub serial: String,
    pub model: String,
    pub allow_any_host: bool,
    pub allowed_hosts: BTreeSet<String>,
    /// Enabled namespaces by NSID.
    pub namespaces: BTreeMap<u32, Arc<Namespace>>,
    /// True for nqn.2014-08.org.nvmexpress.discovery.
    pub is_discovery: bool,
}

impl Subsystem {
    pub fn new(cfg: &SubsystemConfig, namespaces: BTreeMap<u32, Arc<Namespace>>) -> Subsystem {
        Subsystem {
            nqn: cfg.nqn.clone(),
            serial: cfg.serial.clone(),
            model: cfg.model.clone(),
            allow_any_host: cfg.allow_any_host,
            allowed_hosts: cfg
                .allowed_hosts
                .iter()
                .map(|h| h.as_str().to_owned())
                .collect(),
            namespaces,
            is_discovery: false,
        }
    }

    /// The discovery subsystem: every host may connect; what it sees is filtered per host.
    pub fn discovery() -> Subsystem {
        Subsystem {
            nqn: Nqn::discovery(),
            serial: "tessera-discovery".to_owned(),
            model: "Tessera drive server".to_owned(),
            allow_any_host: true,
            allowed_hosts: BTreeSet::new(),
            namespaces: BTreeMap::new(),
            is_discovery: true,
        }
    }

    /// Whether `hostnqn` may connect (and see this subsystem in the discovery log).
    pub fn allows(&self, hostnqn: &str) -> bool {
        self.allow_any_host || self.allowed_hosts.contains(hostnqn)
    }
}
