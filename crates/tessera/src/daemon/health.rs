//! Component health and events, as `mmhealth` keeps them: a monitor thread looks at this
//! node's components once a second (the node's lease, each mounted file system, each NSD
//! it uses; each declustered array and pdisk it serves every five), records the state of each with
//! the time it last changed and why, and writes an event for every change and for every
//! new error it counts. `tessera health` and `/api/v1/health` and `/api/v1/events` read
//! them; the events also go to the daemon log.
//!
//! States are observed, not reported by the code that changes them: the monitor compares
//! what it sees with what it saw, so no I/O path carries health bookkeeping, and an event
//! can never be lost to a code path that forgot to send it.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use tessera_drive::stats::IoKind;

use super::mounts::MountedView;
use super::Daemon;
use crate::rpc::{ComponentHealth, Event, Severity, Status};

/// Events kept for `tessera health node eventlog` (the oldest are dropped).
pub const EVENTS_KEPT: usize = 1000;
/// How often the monitor looks.
pub const MONITOR_INTERVAL: Duration = Duration::from_secs(1);
/// Arrays are looked at every this many monitor ticks: an array's status walks its
/// stripe map (O(stripes)), too much to do every second on a large array.
const ARRAY_TICKS: u64 = 5;
/// The allocator gives free memory back every ten seconds (see `memory::trim`).
const TRIM_TICKS: u64 = 10;
/// An NSD with failed requests stays degraded this long after the last one.
const DISK_ERROR_HOLD: Duration = Duration::from_secs(60);

/// What the monitor saw of one component this time.
struct Observation {
    status: Status,
    reasons: Vec<String>,
    /// The event that a change to this status records.
    event: &'static str,
    message: String,
}

#[derive(Default)]
pub struct Health {
    states: Mutex<BTreeMap<(String, String), ComponentHealth>>,
    events: Mutex<VecDeque<Event>>,
    /// Error counters seen last time, to find new errors.
    counters: Mutex<BTreeMap<(String, String), u64>>,
    /// When each NSD last had a failed request.
    disk_errors_at: Mutex<BTreeMap<String, Instant>>,
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Health {
    pub fn states(&self) -> Vec<ComponentHealth> {
        self.states.lock().values().cloned().collect()
    }

    pub fn events(&self) -> Vec<Event> {
        self.events.lock().iter().cloned().collect()
    }

    pub fn record(
        &self,
        component: &str,
        entity: &str,
        event: &str,
        severity: Severity,
        message: String,
    ) {
        match severity {
            Severity::Info => tracing::info!(component, entity, event, "{message}"),
            Severity::Warning => tracing::warn!(component, entity, event, "{message}"),
            Severity::Error => tracing::error!(component, entity, event, "{message}"),
        }
        let mut events = self.events.lock();
        events.push_back(Event {
            unix: now_unix(),
            component: component.to_string(),
            entity: entity.to_string(),
            event: event.to_string(),
            severity,
            message,
        });
        if events.len() > EVENTS_KEPT {
            events.pop_front();
        }
    }

    /// Updates one component; a changed status records its event.
    fn observe(&self, component: &str, entity: &str, seen: Observation) {
        let key = (component.to_string(), entity.to_string());
        let changed = {
            let mut states = self.states.lock();
            match states.get_mut(&key) {
                Some(known) if known.status == seen.status => {
                    known.reasons = seen.reasons;
                    false
                }
                _ => {
                    states.insert(
                        key,
                        ComponentHealth {
                            component: component.to_string(),
                            entity: entity.to_string(),
                            status: seen.status,
                            since_unix: now_unix(),
                            reasons: seen.reasons,
                        },
                    );
                    true
                }
            }
        };
        if changed {
            let severity = match seen.status {
                Status::Healthy => Severity::Info,
                Status::Degraded => Severity::Warning,
                Status::Failed => Severity::Error,
            };
            self.record(component, entity, seen.event, severity, seen.message);
        }
    }

    /// Forgets components that are gone (an unmounted file system, a deleted array), with
    /// an event saying so.
    fn forget_except(&self, component: &str, present: &[String], event: &str, what: &str) {
        let gone: Vec<String> = self
            .states
            .lock()
            .keys()
            .filter(|(c, e)| c == component && !present.contains(e))
            .map(|(_, e)| e.clone())
            .collect();
        for entity in gone {
            self.states
                .lock()
                .remove(&(component.to_string(), entity.clone()));
            self.record(
                component,
                &entity,
                event,
                Severity::Info,
                format!("{entity} {what}"),
            );
        }
    }

    /// Counts up `value` for a counter of errors; returns how many are new since the last
    /// look (none the first time: errors from before the daemon started are not news).
    fn new_errors(&self, component: &str, entity: &str, value: u64) -> u64 {
        let mut counters = self.counters.lock();
        let key = (component.to_string(), entity.to_string());
        let before = counters.insert(key, value);
        before.map_or(0, |b| value.saturating_sub(b))
    }
}

fn healthy(event: &'static str, message: String) -> Observation {
    Observation {
        status: Status::Healthy,
        reasons: Vec::new(),
        event,
        message,
    }
}

impl Daemon {
    /// Starts the monitor thread: health and the throughput history, once a second.
    pub(super) fn start_monitor(self: &Arc<Self>) -> std::io::Result<()> {
        let daemon = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("monitor".into())
            .spawn(move || {
                for tick in 0u64.. {
                    // Look first, then wait: `health` right after a start has an answer.
                    match daemon.upgrade() {
                        Some(daemon) => daemon.monitor_once(tick % ARRAY_TICKS == 0),
                        None => return,
                    }
                    if tick % TRIM_TICKS == TRIM_TICKS - 1 {
                        super::memory::trim();
                    }
                    std::thread::sleep(MONITOR_INTERVAL);
                }
            })?;
        Ok(())
    }

    fn monitor_once(&self, arrays_too: bool) {
        let mounted = self.mounted_list();
        let fss: Vec<(String, Arc<tessera_fs::FileSystem>)> = mounted
            .iter()
            .map(|m| (m.name.clone(), Arc::clone(&m.fs)))
            .collect();
        self.history.sample(&fss);
        let h = &self.health;
        let node = self.cluster.node_name.clone();
        if self.member.holds_lease() {
            h.observe(
                "node",
                &node,
                healthy(
                    "node_active",
                    format!("{node} is active: it holds its lease"),
                ),
            );
        } else {
            h.observe(
                "node",
                &node,
                Observation {
                    status: Status::Failed,
                    reasons: vec!["no lease: arbitrating for quorum".into()],
                    event: "node_arbitrating",
                    message: format!(
                        "{node} holds no lease and arbitrates: it cannot reach a majority of \
                         the quorum nodes (`tessera state -a`)"
                    ),
                },
            );
        }
        for MountedView { name, fs, nsds, .. } in &mounted {
            let checksum = self
                .health
                .new_errors("filesystem", name, fs.pmon().checksum_errors);
            if checksum > 0 {
                h.record(
                    "filesystem",
                    name,
                    "checksum_errors",
                    Severity::Warning,
                    format!("{checksum} block(s) of {name} failed checksum verification on read"),
                );
            }
            h.observe(
                "filesystem",
                name,
                healthy("fs_mounted", format!("{name} is mounted")),
            );
            // Disks the file system took out (missing at mount, a failed write or flush,
            // `disk change stop`): their copies are read from other failure groups.
            let down: Vec<String> = fs
                .disk_availability()
                .into_iter()
                .filter(|(_, up)| !up)
                .map(|(n, _)| n)
                .collect();
            for nsd in &down {
                h.observe(
                    "disk",
                    nsd,
                    Observation {
                        status: Status::Failed,
                        reasons: vec!["down: no I/O goes to it".into()],
                        event: "disk_down",
                        message: format!(
                            "NSD {nsd} of {name} is down: its copies are read from the other \
                             failure groups and files written meanwhile are ill-replicated; \
                             once it answers, `tessera disk change {name} start -d {nsd}` and \
                             `tessera restripe {name} -r`"
                        ),
                    },
                );
            }
            for (nsd, stats) in nsds {
                if down.contains(nsd) {
                    continue;
                }
                let errors: u64 = IoKind::ALL.iter().map(|k| stats.snapshot(*k).errors).sum();
                let new = h.new_errors("disk", nsd, errors);
                if new > 0 {
                    h.disk_errors_at.lock().insert(nsd.clone(), Instant::now());
                    h.record(
                        "disk",
                        nsd,
                        "disk_io_error",
                        Severity::Warning,
                        format!("{new} request(s) to NSD {nsd} of {name} failed"),
                    );
                }
                let recent = h
                    .disk_errors_at
                    .lock()
                    .get(nsd)
                    .is_some_and(|at| at.elapsed() < DISK_ERROR_HOLD);
                let seen = if recent {
                    Observation {
                        status: Status::Degraded,
                        reasons: vec![format!(
                            "failed requests in the last {} s",
                            DISK_ERROR_HOLD.as_secs()
                        )],
                        event: "disk_degraded",
                        message: format!("NSD {nsd} of {name} has failed requests"),
                    }
                } else {
                    healthy("disk_ok", format!("NSD {nsd} of {name} answers"))
                };
                h.observe("disk", nsd, seen);
            }
        }
        let names: Vec<String> = mounted.iter().map(|m| m.name.clone()).collect();
        h.forget_except(
            "filesystem",
            &names,
            "fs_unmounted",
            "is no longer mounted here",
        );
        let nsd_names: Vec<String> = mounted
            .iter()
            .flat_map(|m| {
                m.nsds
                    .iter()
                    .map(|(n, _)| n.clone())
                    .chain(m.fs.disk_availability().into_iter().map(|(n, _)| n))
            })
            .collect();
        h.forget_except("disk", &nsd_names, "disk_unused", "is no longer used here");
        if arrays_too {
            self.observe_arrays();
        }
    }

    fn observe_arrays(&self) {
        let arrays: Vec<_> = self.arrays.lock().values().cloned().collect();
        let h = &self.health;
        let mut da_names = Vec::new();
        let mut pdisk_names = Vec::new();
        for da in arrays {
            let s = da.status();
            da_names.push(s.name.clone());
            let rebuilding = s.rebuild.active;
            let seen = match s.state {
                tessera_vdisk::DaState::Ok if !rebuilding => healthy(
                    "da_ok",
                    format!("declustered array {} is fully redundant", s.name),
                ),
                tessera_vdisk::DaState::Ok | tessera_vdisk::DaState::Degraded => Observation {
                    status: Status::Degraded,
                    reasons: vec![if rebuilding {
                        "rebuilding".to_string()
                    } else {
                        "lost redundancy".to_string()
                    }],
                    event: "da_degraded",
                    message: format!(
                        "declustered array {} lost redundancy; its rebuild restores it",
                        s.name
                    ),
                },
                tessera_vdisk::DaState::DataLoss => Observation {
                    status: Status::Failed,
                    reasons: vec!["data loss".into()],
                    event: "da_data_loss",
                    message: format!(
                        "declustered array {} lost data: more pdisks failed than its codes \
                         tolerate (`tessera vdisk ls`)",
                        s.name
                    ),
                },
            };
            h.observe("da", &s.name, seen);
            // A replaced pdisk is retired, not failed: it drops out of the components.
            for p in s
                .pdisks
                .iter()
                .filter(|p| p.state != tessera_vdisk::PdiskState::Replaced)
            {
                pdisk_names.push(p.name.clone());
                let errors = p.read_errors + p.write_errors + p.checksum_errors;
                let new = h.new_errors("pdisk", &p.name, errors);
                if new > 0 {
                    h.record(
                        "pdisk",
                        &p.name,
                        "pdisk_errors",
                        Severity::Warning,
                        format!(
                            "pdisk {} of {}: {new} new error(s) (read {}, write {}, checksum {})",
                            p.name, s.name, p.read_errors, p.write_errors, p.checksum_errors
                        ),
                    );
                }
                use tessera_vdisk::PdiskState as P;
                let state = p.state.as_str();
                let seen = match p.state {
                    P::Ok if !p.catching_up => healthy(
                        "pdisk_ok",
                        format!("pdisk {} of {} is in service", p.name, s.name),
                    ),
                    P::Ok | P::Suspended | P::Draining => Observation {
                        status: Status::Degraded,
                        reasons: vec![if p.catching_up {
                            "catching up".to_string()
                        } else {
                            state.to_string()
                        }],
                        event: "pdisk_degraded",
                        message: format!("pdisk {} of {} is {state}", p.name, s.name),
                    },
                    P::Missing | P::Dead | P::Replaced => Observation {
                        status: Status::Failed,
                        reasons: vec![state.to_string()],
                        event: "pdisk_failed",
                        message: format!(
                            "pdisk {} of {} is {state}: its strips are rebuilt on the \
                             others; replace it with `tessera pdisk replace`",
                            p.name, s.name
                        ),
                    },
                };
                h.observe("pdisk", &p.name, seen);
            }
        }
        h.forget_except("da", &da_names, "da_closed", "is no longer served here");
        h.forget_except(
            "pdisk",
            &pdisk_names,
            "pdisk_removed",
            "is no longer served here",
        );
    }
}
