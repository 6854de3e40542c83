//! The metadata core without FUSE and without the kernel: create, stat (lookup + getattr,
//! from a fresh mount) and unlink of `N` empty files over `DIRS` directories, with the
//! daemon's default caches, printing the rate and this process's CPU time per operation
//! in windows of `WINDOW` operations. It isolates what the daemon itself spends per
//! operation as the file count grows, which bench/md_scale.sh measures end to end.
//!
//!   N=2000000 DIRS=1000 WINDOW=200000 WORK=/var/tmp/md-core cargo bench -p tessera-fs --bench md_core
//!
//! Drives are four sparse files of DRIVE_BYTES (default 8G) in WORK.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use tessera_drive::{BlockDevice, FileDrive};
use tessera_fs::{Caller, DiskSpec, FileKind, FileSystem, FormatOptions, Ino, ROOT_INO};
use tessera_nsd::descriptor::{write_descriptor, NsdDescriptor};
use tessera_nsd::{DiskUsage, NsdId};

const ROOT: Caller = Caller { uid: 0, gid: 0 };

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// CPU ticks (user, system) of this process.
fn cpu_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split(' ').collect();
    (f[11].parse().unwrap(), f[12].parse().unwrap())
}

struct Window {
    what: &'static str,
    start: Instant,
    ticks: (u64, u64),
    done: u64,
}

impl Window {
    fn new(what: &'static str) -> Window {
        Window {
            what,
            start: Instant::now(),
            ticks: cpu_ticks(),
            done: 0,
        }
    }

    fn report(&mut self, total: u64) {
        let secs = self.start.elapsed().as_secs_f64();
        let (u, s) = cpu_ticks();
        let tick_us = 1e6 / 100.0;
        let per = |t: u64| t as f64 * tick_us / self.done as f64;
        println!(
            "{:<7} {:>10} {:>10.0}/s  user {:>6.1} us/op  sys {:>6.1} us/op",
            self.what,
            total,
            self.done as f64 / secs,
            per(u - self.ticks.0),
            per(s - self.ticks.1)
        );
        *self = Window::new(self.what);
    }
}

fn open(dir: &Path) -> Vec<(NsdId, Arc<dyn BlockDevice>)> {
    (0..4)
        .map(|i| {
            let dev: Arc<dyn BlockDevice> =
                Arc::new(FileDrive::open(&dir.join(format!("d{i}"))).unwrap());
            let id = tessera_nsd::descriptor::read_descriptor(dev.as_ref())
                .unwrap()
                .unwrap()
                .id;
            (id, dev)
        })
        .collect()
}

fn configure(fs: &FileSystem) {
    // The daemon's defaults (maxFilesToCache, maxStatCache, pagepool).
    fs.set_inode_cache(50_000);
    fs.set_stat_cache(env("STAT_CACHE", 50_000) as usize);
    fs.set_metadata_cache_bytes(env("PAGEPOOL", 1 << 30));
}

fn name(i: u64) -> Vec<u8> {
    format!("file.{i:010}").into_bytes()
}

fn main() {
    let n = env("N", 2_000_000);
    let dirs = env("DIRS", 1000).max(1);
    let window = env("WINDOW", 200_000).max(1);
    let drive_bytes = env("DRIVE_BYTES", 8 << 30);
    let work = std::env::var("WORK").unwrap_or_else(|_| "/var/tmp/tessera-md-core".into());
    let work = Path::new(&work);
    let _ = std::fs::remove_dir_all(work);
    std::fs::create_dir_all(work).unwrap();
    let mut specs = Vec::new();
    for i in 0..4 {
        let path = work.join(format!("d{i}"));
        std::fs::File::create(&path)
            .unwrap()
            .set_len(drive_bytes)
            .unwrap();
        let dev: Arc<dyn BlockDevice> = Arc::new(FileDrive::open(&path).unwrap());
        let id = NsdId::random();
        let nd = NsdDescriptor {
            id,
            name: format!("nsd{i}"),
            device_bytes: drive_bytes,
            created_unix: 0,
            cluster_id: [0; 16],
        };
        write_descriptor(dev.as_ref(), &nd).unwrap();
        specs.push(DiskSpec {
            nsd_name: format!("nsd{i}"),
            nsd_id: id,
            usage: DiskUsage::DataAndMetadata,
            failure_group: i + 1,
            pool: "system".into(),
            device: dev,
        });
    }
    let opts = FormatOptions {
        block_size: 4 << 20,
        max_inodes: n + n / 5 + 10_000,
        ..Default::default()
    };
    tessera_fs::format(specs, &opts, &mut |_| {}).unwrap();

    let fs = FileSystem::mount(open(work)).unwrap();
    configure(&fs);
    let dir_inos: Vec<Ino> = (0..dirs)
        .map(|d| {
            let name = format!("dir.{d:05}");
            fs.create_node(
                ROOT_INO,
                name.as_bytes(),
                FileKind::Directory,
                0o755,
                0,
                ROOT,
                None,
            )
            .unwrap()
            .ino
        })
        .collect();
    // Files go round-robin over the directories, as mdtest's unique-directory mode does not,
    // but as md_scale's mdbench does.
    let mut w = Window::new("create");
    for i in 0..n {
        let d = dir_inos[(i % dirs) as usize];
        // As the kernel does for open(O_CREAT|O_EXCL): a lookup that finds nothing, the
        // create (which opens), the release at close.
        assert!(fs.lookup(d, &name(i)).is_err());
        let a = fs
            .create_node(d, &name(i), FileKind::Regular, 0o644, 0, ROOT, None)
            .unwrap();
        fs.open(a.ino).unwrap();
        fs.release(a.ino).unwrap();
        w.done += 1;
        if (i + 1) % window == 0 {
            w.report(i + 1);
        }
    }
    fs.unmount().unwrap();
    drop(fs);

    let start = Instant::now();
    let fs = FileSystem::mount(open(work)).unwrap();
    println!(
        "mount   {:>10} {:.0} ms",
        n,
        start.elapsed().as_secs_f64() * 1e3
    );
    configure(&fs);
    let mut w = Window::new("stat");
    for i in 0..n {
        let d = dir_inos[(i % dirs) as usize];
        let a = fs.lookup(d, &name(i)).unwrap();
        fs.getattr(a.ino).unwrap();
        w.done += 1;
        if (i + 1) % window == 0 {
            w.report(i + 1);
        }
    }
    let mut w = Window::new("unlink");
    for i in 0..n {
        let d = dir_inos[(i % dirs) as usize];
        fs.lookup(d, &name(i)).unwrap();
        fs.remove(d, &name(i), false).unwrap();
        w.done += 1;
        if (i + 1) % window == 0 {
            w.report(i + 1);
        }
    }
    fs.unmount().unwrap();
}
