//! `health [node|fs|disk|pdisk|da] [show|eventlog] [NAME]` [mmhealth]: the states of this
//! node's components as the daemon's monitor sees them (HEALTHY, DEGRADED, FAILED), since
//! when and why, and the events that changed them. `node` covers every component; the
//! others narrow to one kind, and NAME to one entity.

use anyhow::{bail, Result};

use super::{call, unexpected};
use crate::cli::{HealthAction, HealthArgs, HealthComponent};
use crate::config::Home;
use crate::output::{local_time, Table, YRecord};
use crate::rpc::{HealthReport, Reply, Request, Status};

/// The monitor's name for a kind of component; `None` for all of them.
fn kind(c: HealthComponent) -> Option<&'static str> {
    match c {
        HealthComponent::Node => None,
        HealthComponent::Fs => Some("filesystem"),
        HealthComponent::Disk => Some("disk"),
        HealthComponent::Pdisk => Some("pdisk"),
        HealthComponent::Da => Some("da"),
    }
}

pub fn health(home: &Home, a: &HealthArgs) -> Result<()> {
    let report = match call(home, &Request::Health)? {
        Reply::Health(r) => r,
        other => return Err(unexpected(other)),
    };
    let wanted = |component: &str, entity: &str| {
        kind(a.component).is_none_or(|k| k == component)
            && a.name.as_deref().is_none_or(|n| n == entity)
    };
    let known = report
        .components
        .iter()
        .any(|c| wanted(&c.component, &c.entity));
    if let (Some(name), false) = (&a.name, known) {
        bail!(
            "{name}: no such {} on this node; `tessera health node show` lists them",
            kind(a.component).unwrap_or("component")
        );
    }
    match a.action {
        HealthAction::Show => show(&report, &wanted, a.machine),
        HealthAction::Eventlog => eventlog(&report, &wanted, a.machine),
    }
    Ok(())
}

fn show(r: &HealthReport, wanted: &dyn Fn(&str, &str) -> bool, machine: bool) {
    let rows: Vec<_> = r
        .components
        .iter()
        .filter(|c| wanted(&c.component, &c.entity))
        .collect();
    if machine {
        let y = YRecord::new("health", "component");
        println!(
            "{}",
            y.header(&["node", "component", "entity", "status", "since", "reasons"])
        );
        for c in rows {
            println!(
                "{}",
                y.data(&[
                    r.node.clone(),
                    c.component.clone(),
                    c.entity.clone(),
                    c.status.as_str().into(),
                    c.since_unix.to_string(),
                    c.reasons.join(";"),
                ])
            );
        }
        return;
    }
    // The node's status is that of its worst component, as mmhealth rolls it up.
    let worst = r.components.iter().max_by_key(|c| (c.status, c.since_unix));
    println!("Node name:      {}", r.node);
    println!(
        "Node status:    {}",
        worst.map_or(Status::Healthy, |c| c.status).as_str()
    );
    if let Some(c) = worst.filter(|c| c.status != Status::Healthy) {
        println!("Status change:  {}", local_time(c.since_unix, false));
    }
    println!();
    if rows.is_empty() {
        println!("(no such component seen yet: the daemon's monitor looks once a second)");
        return;
    }
    let mut t = Table::new(&["component", "entity", "status", "status change", "reasons"]);
    for c in rows {
        t.row(vec![
            c.component.to_uppercase(),
            c.entity.clone(),
            c.status.as_str().into(),
            local_time(c.since_unix, false),
            if c.reasons.is_empty() {
                "-".into()
            } else {
                c.reasons.join("; ")
            },
        ]);
    }
    print!("{}", t.render());
}

fn eventlog(r: &HealthReport, wanted: &dyn Fn(&str, &str) -> bool, machine: bool) {
    let events: Vec<_> = r
        .events
        .iter()
        .filter(|e| wanted(&e.component, &e.entity))
        .collect();
    if machine {
        let y = YRecord::new("health", "event");
        println!(
            "{}",
            y.header(&[
                "node",
                "time",
                "component",
                "entity",
                "event",
                "severity",
                "message"
            ])
        );
        for e in events {
            println!(
                "{}",
                y.data(&[
                    r.node.clone(),
                    e.unix.to_string(),
                    e.component.clone(),
                    e.entity.clone(),
                    e.event.clone(),
                    format!("{:?}", e.severity).to_lowercase(),
                    e.message.clone(),
                ])
            );
        }
        return;
    }
    let mut t = Table::new(&[
        "time",
        "component",
        "entity",
        "event",
        "severity",
        "message",
    ]);
    for e in events {
        t.row(vec![
            local_time(e.unix, false),
            e.component.to_uppercase(),
            e.entity.clone(),
            e.event.clone(),
            format!("{:?}", e.severity).to_uppercase(),
            e.message.clone(),
        ]);
    }
    print!("{}", t.render());
}
