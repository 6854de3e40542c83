//! `tessera bench`: measurements an administrator runs on their own hardware. They run in
//! the CLI process and need no daemon, so a CPU can be judged before a cluster exists.

use anyhow::{bail, Result};
use tessera_ec::Code;

use super::units::parse_size;
use crate::output::{Table, YRecord};

/// The largest strip `bench ec` accepts: the largest block (16 MiB) of the smallest code
/// that splits it (4 strips) would be 4 MiB; 16 MiB covers replication of whole blocks.
const STRIP_MAX_BYTES: u64 = 16 << 20;

/// `tessera bench ec --code 8+2p --strip 128K [--seconds N]`: encode and decode GB/s of
/// data on one core, like ceph_erasure_code_benchmark.
pub fn ec(code: &str, strip: &str, seconds: f64, machine: bool) -> Result<()> {
    let code = Code::parse(code)?;
    let strip_bytes = match parse_size(strip) {
        Some(n) if n > 0 && n <= STRIP_MAX_BYTES => n,
        _ => bail!(
            "--strip {strip}: not a strip size; use a size from 1 byte to 16M such as \
             128K or 1M"
        ),
    };
    if !(seconds > 0.0 && seconds <= 3600.0) {
        bail!("--seconds {seconds}: use a duration from 0.1 to 3600 seconds");
    }
    let report = tessera_ec::bench::run(code, strip_bytes as usize, seconds)?;
    let y = YRecord::new("bench", "ec");
    if machine {
        println!(
            "{}",
            y.header(&["code", "stripBytes", "kernel", "encodeGBps", "decodeGBps"])
        );
        println!(
            "{}",
            y.data(&[
                report.code.to_string(),
                report.strip_bytes.to_string(),
                report.kernel.to_string(),
                format!("{:.3}", report.encode_gbps),
                format!("{:.3}", report.decode_gbps),
            ])
        );
        return Ok(());
    }
    let lost = code.fault_tolerance();
    println!(
        "code {}, strip {} bytes, kernel {}, one thread; GB/s of data (1 GB = 10^9 bytes)",
        report.code, report.strip_bytes, report.kernel
    );
    let mut table = Table::new(&["operation", "GB/s"]).right(&[1]);
    table.row(vec!["encode".into(), format!("{:.2}", report.encode_gbps)]);
    table.row(vec![
        format!("decode ({lost} data strips lost)"),
        format!("{:.2}", report.decode_gbps),
    ]);
    print!("{}", table.render());
    Ok(())
}
