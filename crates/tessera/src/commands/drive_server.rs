//! `tessera drive-server -c CONFIG`: exports local drives over NVMe/TCP, pass-through with
//! no data services, like a JBOF enclosure or the controllers of an array. It runs in the
//! foreground (a service manager keeps it running) and stops cleanly on SIGTERM or SIGINT.

use std::path::Path;

use anyhow::{anyhow, Result};

use crate::output::Table;

pub fn run(config_path: &Path) -> Result<()> {
    init_logging();
    let config = tessera_nvme::target::TargetConfig::load(config_path)
        .map_err(|e| anyhow!("{}: {e}", config_path.display()))?;
    // Blocked before the server starts its threads, so they inherit the mask.
    let signals = crate::signals::block_termination()?;
    let server = tessera_nvme::target::DriveServer::start(config)
        .map_err(|e| anyhow!("{}: {e}", config_path.display()))?;
    let mut table = Table::new(&["port", "address"]).right(&[0]);
    for (portid, addr) in server.local_addrs() {
        table.row(vec![portid.to_string(), addr.to_string()]);
    }
    print!("{}", table.render());
    println!("drive server running; stop it with SIGTERM or Ctrl-C");
    let signal = crate::signals::wait(&signals);
    tracing::info!("signal {signal} received; stopping the drive server");
    server.shutdown();
    Ok(())
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
