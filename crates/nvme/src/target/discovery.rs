//! The discovery log page (NVMe-oF 1.1, 5.3) of the built-in discovery controller.
//!
//! A host sees one entry per (subsystem it may access, enabled port exporting it), so
//! `nvme discover` against any one port of a server lists every path to each subsystem,
//! as array administrators expect, plus the referrals configured on the port it asked.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::config::PortAddr;
use super::server::{Port, ServerShared};
use crate::wire::log::{adrfam, subtype, treq, trtype, DiscoveryEntry, DiscoveryLog};
use crate::wire::{FixedAscii, Nqn};

/// Admin submission queue size reported in entries (the admin queue Linux uses).
const ASQSZ: u16 = 32;

/// The discovery log as `hostnqn` sees it through `port`.
pub(crate) fn log(shared: &ServerShared, port: &Arc<Port>, hostnqn: &str) -> DiscoveryLog {
    let mut entries = Vec::new();
    let subsystems: Vec<_> = shared.subsystems.read().values().cloned().collect();
    for subsys in subsystems.iter().filter(|s| s.allows(hostnqn)) {
        for p in shared
            .ports
            .iter()
            .filter(|p| p.exports(subsys.nqn.as_str()))
        {
            if !p.enabled.load(Ordering::SeqCst) {
                continue;
            }
            let Some(addr) = *p.addr.lock() else { continue };
            let bound = PortAddr {
                ipv6: addr.is_ipv6(),
                traddr: p.cfg.addr.traddr,
                trsvcid: addr.port(),
            };
            entries.push(entry(subtype::NVM, p.portid(), &bound, subsys.nqn.clone()));
        }
    }
    for r in &port.cfg.referrals {
        entries.push(entry(
            subtype::REFERRAL,
            r.portid,
            &r.addr,
            Nqn::discovery(),
        ));
    }
    DiscoveryLog {
        genctr: shared.genctr.load(Ordering::SeqCst),
        recfmt: 0,
        entries,
    }
}

fn entry(kind: u8, portid: u16, addr: &PortAddr, subnqn: Nqn) -> DiscoveryEntry {
    DiscoveryEntry {
        trtype: trtype::TCP,
        adrfam: if addr.ipv6 {
            adrfam::IPV6
        } else {
            adrfam::IPV4
        },
        subtype: kind,
        treq: treq::SECURE_CHANNEL_NOT_REQUIRED | treq::SQ_FLOW_CONTROL_DISABLE,
        portid,
        cntlid: crate::wire::fabrics::CNTLID_DYNAMIC,
        asqsz: ASQSZ,
        eflags: 0,
        trsvcid: FixedAscii::new(&addr.trsvcid.to_string()).unwrap_or_default(),
        subnqn,
        traddr: FixedAscii::new(&addr.traddr.to_string()).unwrap_or_default(),
        tsas: [0; 256],
    }
}
