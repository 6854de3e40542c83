//! `tessera drive-server -c CONFIG`: exports local drives over NVMe/TCP, pass-through with
//! no data services, like a JBOF enclosure or the controllers of an array. It runs in the
//! foreground (a service manager keeps it running) and stops cleanly on SIGTERM or SIGINT.

use std::path::Path;

use anyhow::{anyhow, Result};

use crate::output::Table;

pub fn run(config_path: &Path, metrics_address: Option<&str>) -> Result<()> {
    init_logging();
    let mut config = tessera_nvme::target::TargetConfig::load(config_path)
        .map_err(|e| anyhow!("{}: {e}", config_path.display()))?;
    // Blocked before the server starts its threads, so they inherit the mask.
    let signals = crate::signals::block_termination_and_reload()?;
    let server = tessera_nvme::target::DriveServer::start(config.clone())
        .map_err(|e| anyhow!("{}: {e}", config_path.display()))?;
    let mut table = Table::new(&["port", "address"]).right(&[0]);
    for (portid, addr) in server.local_addrs() {
        table.row(vec![portid.to_string(), addr.to_string()]);
    }
    print!("{}", table.render());
    if let Some(address) = metrics_address {
        let bound = super::drive_server_metrics::start(address, server.stats_source())?;
        println!("Prometheus metrics on http://{bound}/metrics");
    }
    match &config.state_dir {
        Some(dir) => println!(
            "reservations with PTPL persist through restarts in {}",
            dir.display()
        ),
        None => println!(
            "reservations do not survive a restart (no \"tessera\".state_dir in {}); \
             hosts asking for PTPL get Invalid Field",
            config_path.display()
        ),
    }
    println!("drive server running; SIGHUP rereads the ANA states, SIGTERM or Ctrl-C stops it");
    loop {
        let signal = crate::signals::wait(&signals);
        if signal != libc::SIGHUP {
            tracing::info!("signal {signal} received; stopping the drive server");
            break;
        }
        reload(config_path, &server, &mut config);
    }
    server.shutdown();
    Ok(())
}

/// SIGHUP: rereads the configuration and applies its ANA states, the way an array fails
/// namespaces over between its controllers; hosts that asked for ANA change events get
/// one. A file that does not validate changes nothing. Other differences are logged as
/// waiting for a restart rather than half applied.
fn reload(
    path: &Path,
    server: &tessera_nvme::target::DriveServer,
    running: &mut tessera_nvme::target::TargetConfig,
) {
    let new = match tessera_nvme::target::TargetConfig::load(path) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(
                "SIGHUP: {}: {e}; nothing changed, fix the file and signal again",
                path.display()
            );
            return;
        }
    };
    let plan = running.reload_plan(&new);
    for &(portid, grpid, state) in &plan.ana_changes {
        match server.set_ana_state(portid, grpid, state) {
            Ok(()) => {
                if let Some(p) = running.ports.iter_mut().find(|p| p.portid == portid) {
                    p.ana_groups.insert(grpid, state);
                }
            }
            Err(e) => tracing::error!("SIGHUP: port {portid} ANA group {grpid}: {e}"),
        }
    }
    if plan.ana_changes.is_empty() {
        tracing::info!("SIGHUP: {}: no ANA state changed", path.display());
    }
    if !plan.needs_restart.is_empty() {
        tracing::warn!(
            "SIGHUP: {}: {} take effect only when the drive server restarts",
            path.display(),
            plan.needs_restart.join(", ")
        );
    }
}

/// Logs go to stderr: the drive server is a foreground process whose output a service
/// manager collects. `TESSERA_LOG` sets the filter as for the daemon.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("TESSERA_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
}
