//! A file system dropped without unmount (a failed mount, a crash test) leaves no read-ahead
//! workers behind. Alone in its binary, so no other test's threads are counted.

mod common;

use std::time::{Duration, Instant};

use common::*;
use tessera_fs::{FileSystem, Ino, ROOT_INO};

fn prefetch_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with("tessera-prefet"))
        .count()
}

fn read_through(fs: &FileSystem, ino: Ino, len: u64) {
    let mut at = 0;
    while at < len {
        at += fs.read(ino, at, 128 << 10).unwrap().len() as u64;
    }
}

#[test]
fn dropped_file_systems_stop_their_read_ahead_workers() {
    let t = make_disks(4, 64 << 20);
    format_fs(&t, &small_opts());
    for round in 0..3 {
        let fs = mount(&t);
        // A new thread names itself once it runs.
        let deadline = Instant::now() + Duration::from_secs(5);
        while prefetch_threads() == 0 {
            assert!(
                Instant::now() < deadline,
                "no read-ahead workers while mounted"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let name = format!("x{round}");
        let f = create_file(&fs, ROOT_INO, name.as_bytes());
        fs.write(f.ino, 0, &pattern(4 << 20, round), false).unwrap();
        read_through(&fs, f.ino, 4 << 20);
        if round == 0 {
            fs.unmount().unwrap();
            assert_eq!(prefetch_threads(), 0, "unmount joins the workers");
        }
        drop(fs);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while prefetch_threads() > 0 {
        assert!(
            Instant::now() < deadline,
            "{} read-ahead workers still running",
            prefetch_threads()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
