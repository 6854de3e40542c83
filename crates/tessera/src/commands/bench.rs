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

/// `tessera bench vdisk`: what a declustered array gives on these drives. Measures, in one
/// run, the raw drives written and read in parallel (the reference), then an array and a
/// vdisk built on the same drives written and read sequentially in whole blocks, then
/// (with `--rebuild`) the rebuild of one failed pdisk and a foreground read meanwhile.
/// Destroys whatever the drives held.
pub struct VdiskBenchArgs<'a> {
    pub rounds: usize,
    pub stanza: &'a std::path::Path,
    pub code: &'a str,
    pub block_size: &'a str,
    pub size: &'a str,
    pub threads: usize,
    pub rebuild: bool,
}

/// The median of `values` (sorted in place).
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// MB/s (10^6 bytes per second) of `bytes` moved in `elapsed`.
fn mb_s(bytes: u64, elapsed: std::time::Duration) -> f64 {
    bytes as f64 / elapsed.as_secs_f64().max(1e-9) / 1e6
}

/// Writes (or reads) `bytes` from `offset` on `dev` in `chunk`-byte I/Os.
fn stream(
    dev: &dyn tessera_drive::BlockDevice,
    offset: u64,
    bytes: u64,
    chunk: usize,
    write: bool,
) -> Result<()> {
    let mut buf = tessera_drive::AlignedBuf::zeroed(chunk);
    // Incompressible-looking data, so no layer below can cheat on zeros.
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ offset;
    for b in buf.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let mut done = 0;
    while done < bytes {
        let at = offset + done;
        if write {
            dev.write_at(&buf, at)?;
        } else {
            dev.read_at(&mut buf, at)?;
        }
        done += chunk as u64;
    }
    if write {
        dev.flush()?;
    }
    Ok(())
}

/// Runs `stream` on every (device, offset, bytes) in parallel; returns the elapsed time.
fn parallel(
    jobs: &[(std::sync::Arc<dyn tessera_drive::BlockDevice>, u64, u64)],
    chunk: usize,
    write: bool,
) -> Result<std::time::Duration> {
    let start = std::time::Instant::now();
    std::thread::scope(|scope| {
        let handles: Vec<_> = jobs
            .iter()
            .map(|(dev, offset, bytes)| {
                scope.spawn(move || stream(dev.as_ref(), *offset, *bytes, chunk, write))
            })
            .collect();
        handles
            .into_iter()
            .try_for_each(|h| h.join().expect("bench thread"))
    })?;
    Ok(start.elapsed())
}

pub fn vdisk(a: &VdiskBenchArgs) -> Result<()> {
    use std::sync::Arc;
    use tessera_drive::{BlockDevice, FileDrive};
    use tessera_vdisk::{DaOptions, DeclusteredArray, PdiskSpec, VdiskSize};

    let code = Code::parse(a.code)?;
    let block = u64::from(super::units::parse_block_size(a.block_size)?);
    let Some(size) = parse_size(a.size).filter(|n| *n >= block) else {
        bail!(
            "--size {}: use a size of at least one block, such as 4G",
            a.size
        );
    };
    if a.rounds == 0 || a.rounds > 100 {
        bail!("--rounds {}: use 1 to 100 rounds", a.rounds);
    }
    if a.threads == 0 || a.threads > 256 {
        bail!("--threads {}: use 1 to 256 threads", a.threads);
    }
    let text = super::nsd::read_stanza_file(a.stanza)?;
    let stanzas = tessera_nsd::parse_pdisk_stanzas(&text)
        .map_err(|e| anyhow::anyhow!("{}: {e}", a.stanza.display()))?;
    if stanzas.len() < code.total_strips() {
        bail!(
            "{}: {} pdisks cannot hold a {code} stripe of {} strips on distinct pdisks",
            a.stanza.display(),
            stanzas.len(),
            code.total_strips()
        );
    }
    let specs: Vec<PdiskSpec> = stanzas
        .iter()
        .map(|s| {
            Ok(PdiskSpec {
                name: s.pdisk.clone(),
                device: super::nsd::resolve_device(&s.device)?.into(),
                enclosure: s.enclosure.clone(),
                slot: s.slot,
            })
        })
        .collect::<Result<_>>()?;
    let k = code.data_strips() as u64;
    let n = code.total_strips() as u64;
    let physical = size / k * n;
    let chunk = 1usize << 20;
    let drives: Vec<Arc<dyn BlockDevice>> = specs
        .iter()
        .map(|s| Ok(Arc::new(FileDrive::open(&s.device)?) as Arc<dyn BlockDevice>))
        .collect::<Result<_>>()?;
    let share = (physical / drives.len() as u64).div_ceil(chunk as u64) * chunk as u64;
    // The reference runs on the last `share` bytes of every drive. The array allocates
    // strips first-fit from the front, so the vdisk (about `share` per drive plus
    // metadata) never reaches that tail when each drive holds three shares and 512 MiB.
    let smallest = drives.iter().map(|d| d.size_bytes()).min().expect("drives");
    if smallest < 3 * share + (512 << 20) {
        bail!(
            "drives of {} MiB are too small for --size {}: each needs {} MiB (three times its \
             share of the stripes, plus 512 MiB); use larger drives or a smaller --size",
            smallest >> 20,
            a.size,
            (3 * share + (512 << 20)) >> 20
        );
    }
    let raw_jobs: Vec<_> = drives
        .iter()
        .map(|d| {
            (
                Arc::clone(d),
                (d.size_bytes() - share) / chunk as u64 * chunk as u64,
                share,
            )
        })
        .collect();
    let raw_bytes = share * drives.len() as u64;

    let opts = DaOptions {
        force: true,
        ..DaOptions::default()
    };
    let da = DeclusteredArray::create("bench", &specs, opts)?;
    let result = (|| -> Result<()> {
        let vd = da.create_vdisk("bench", code, block, VdiskSize::Bytes(size))?;
        let size = vd.size_bytes();
        let per_thread = (size / a.threads as u64) / block * block;
        println!(
            "raw: {} drives, {} MiB each at their end, 1 MiB O_DIRECT I/O, one thread per drive",
            raw_jobs.len(),
            share >> 20
        );
        println!(
            "vdisk: {code}, block {} KiB, {} MiB, {} threads, whole-block I/O",
            block >> 10,
            size >> 20,
            a.threads
        );
        println!(
            "{} rounds, each: raw write, vdisk write, raw read, vdisk read (interleaved so \
             that a slow spell of the host hits both)",
            a.rounds
        );
        let dev: Arc<dyn BlockDevice> = vd;
        let jobs: Vec<_> = (0..a.threads as u64)
            .map(|t| (Arc::clone(&dev), t * per_thread, per_thread))
            .collect();
        let data = per_thread * a.threads as u64;
        let efficiency = k as f64 / n as f64;
        let mut table = Table::new(&[
            "round",
            "raw write",
            "vdisk write",
            "write / (raw x k/(k+m))",
            "raw read",
            "vdisk read",
            "read / raw",
        ])
        .right(&[0, 1, 2, 3, 4, 5, 6]);
        let (mut write_ratios, mut read_ratios, mut vd_reads) =
            (Vec::new(), Vec::new(), Vec::new());
        for round in 1..=a.rounds {
            let raw_write = mb_s(raw_bytes, parallel(&raw_jobs, chunk, true)?);
            let vd_write = mb_s(data, parallel(&jobs, block as usize, true)?);
            let raw_read = mb_s(raw_bytes, parallel(&raw_jobs, chunk, false)?);
            let vd_read = mb_s(data, parallel(&jobs, block as usize, false)?);
            let w = vd_write / (raw_write * efficiency);
            let r = vd_read / raw_read;
            write_ratios.push(w);
            read_ratios.push(r);
            vd_reads.push(vd_read);
            table.row(vec![
                round.to_string(),
                format!("{raw_write:.0} MB/s"),
                format!("{vd_write:.0} MB/s"),
                format!("{w:.2}"),
                format!("{raw_read:.0} MB/s"),
                format!("{vd_read:.0} MB/s"),
                format!("{r:.2}"),
            ]);
        }
        print!("{}", table.render());
        println!(
            "median: vdisk write {:.2} of raw x k/(k+m), vdisk read {:.2} of raw",
            median(&mut write_ratios),
            median(&mut read_ratios)
        );
        let vd_read = median(&mut vd_reads);
        if a.rebuild {
            let wait_rebuilt = || {
                while da.status().rebuild.active || da.pending_work().is_some() {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
            };
            // Alone: how fast redundancy comes back on an idle array.
            let victim = &specs[0].name;
            let before = da.status().rebuild.bytes;
            let start = std::time::Instant::now();
            da.pdisk_fail(victim)?;
            wait_rebuilt();
            let elapsed = start.elapsed();
            let rebuilt = da.status().rebuild.bytes.saturating_sub(before);
            println!(
                "rebuild of pdisk {victim}, idle array: {} MiB reconstructed in {:.1} s = {:.0} MB/s \
                 (reading {}x that from the survivors)",
                rebuilt >> 20,
                elapsed.as_secs_f64(),
                mb_s(rebuilt, elapsed),
                k
            );
            // Under load: a second pdisk fails while the vdisk is being read.
            let victim = &specs[specs.len() / 2].name;
            da.pdisk_fail(victim)?;
            let fg = parallel(&jobs, block as usize, false)?;
            let fg_rate = mb_s(data, fg);
            wait_rebuilt();
            println!(
                "rebuild of pdisk {victim} during a full read of the vdisk: foreground read \
                 {fg_rate:.0} MB/s ({:.2} of the read without rebuild; rebuild_io_share 50%)",
                fg_rate / vd_read
            );
        }
        Ok(())
    })();
    let closed = da.close();
    result?;
    closed?;
    Ok(())
}
