//! A vdisk flush reports writes durable only once they are: even while another flush of
//! the same pdisks is still under way (found by `crash.rs::power_loss_loop` on a loaded
//! machine: a writer's flush returned while another thread's flush of a pdisk had not yet
//! written back that pdisk's cache, and the power loss right after took the write).
//!
//! Its signature in the loop was `sector 8835: holds write 0, expected one of [6000111]`:
//! write 6000111 is round 1, writer 0, step 37 (ids are `((round + 1) * 10^6 + step) *
//! writers + writer`; the loop now spells them out), the first write into stripe 138 and
//! flushed at once, read back as never written: a flushed write lost, as this race loses it
//! (read as "round 5" from the id's leading digits, it looked like an older write destroyed
//! by recovery).

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use common::*;
use tessera_drive::{BlockDevice, FileDrive, VolatileCacheConfig};
use tessera_vdisk::{Code, DaOptions, DeclusteredArray, DeviceOpener, VdiskSize};

const BLOCK: u64 = 256 << 10;

/// Holds the first flush that reaches any drive until released.
#[derive(Default)]
struct Gate {
    armed: AtomicBool,
    /// 0: nobody held, 1: a flush is held, 2: released.
    state: Mutex<u8>,
    changed: Condvar,
}

impl Gate {
    fn hold_if_armed(&self) {
        if !self.armed.swap(false, Ordering::AcqRel) {
            return;
        }
        let mut s = self.state.lock().unwrap();
        *s = 1;
        self.changed.notify_all();
        while *s != 2 {
            s = self.changed.wait(s).unwrap();
        }
    }

    fn wait_held(&self) {
        let mut s = self.state.lock().unwrap();
        while *s != 1 {
            s = self.changed.wait(s).unwrap();
        }
    }

    fn release(&self) {
        *self.state.lock().unwrap() = 2;
        self.changed.notify_all();
    }
}

/// Drives behind volatile write caches that never destage on their own.
fn cached_drives(gate: &Arc<Gate>, drives: &Drives) -> DeviceOpener {
    let (gate, drives) = (gate.clone(), drives.clone());
    Arc::new(move |path: &Path| {
        let cache = VolatileCacheConfig {
            seed: 1,
            capacity_bytes: 64 << 20,
            early_destage_one_in: 0,
        };
        let inner = Arc::new(FileDrive::open(path)?);
        let d = Arc::new(SimDrive::with_cache(inner, Arc::default(), cache));
        let g = gate.clone();
        d.set_flush_hook(move || g.hold_if_armed());
        drives.lock().unwrap().push(d.clone());
        Ok(d as Arc<dyn BlockDevice>)
    })
}

type Drives = Arc<Mutex<Vec<Arc<SimDrive>>>>;

/// An array of twelve pdisks with an 8+2p vdisk "v", opened again over drives behind
/// volatile caches (listed in the returned drives) whose flushes `gate` can hold.
fn cached_array() -> (TestPdisks, Arc<Gate>, Drives, Arc<DeclusteredArray>) {
    let t = make_pdisks(12, 6, 64 * MIB);
    let da = create(&t, DaOptions::default());
    let code = Code::parse("8+2p").unwrap();
    da.create_vdisk("v", code, BLOCK, VdiskSize::Bytes(16 * MIB))
        .unwrap();
    da.close().unwrap();
    drop(da);
    let gate = Arc::new(Gate::default());
    let drives: Drives = Arc::default();
    let opts = DaOptions {
        opener: Some(cached_drives(&gate, &drives)),
        ..DaOptions::default()
    };
    let da = DeclusteredArray::open_with("da1", &t.paths(), &opts).unwrap();
    (t, gate, drives, da)
}

#[test]
fn flush_returns_only_after_a_concurrent_flush_of_the_same_pdisk_is_durable() {
    let (_t, gate, drives, da) = cached_array();
    let v = da.vdisk("v").unwrap();
    v.write_at(&pattern(BLOCK as usize, 7), 0).unwrap();

    // Another flush (a second writer's) takes over a pdisk's pending writes and stalls
    // before its drive has written them back.
    gate.armed.store(true, Ordering::Release);
    let other = {
        let v = v.clone();
        std::thread::spawn(move || v.flush())
    };
    gate.wait_held();
    v.flush().unwrap();
    let unflushed: Vec<(String, u64)> = drives
        .lock()
        .unwrap()
        .iter()
        .map(|d| (d.name().to_string(), d.unflushed_bytes()))
        .filter(|(_, b)| *b > 0)
        .collect();
    gate.release();
    other.join().unwrap().unwrap();
    assert!(
        unflushed.is_empty(),
        "the flush returned while these drives still held written data in their volatile \
         caches (a power loss now would lose writes reported durable): {unflushed:?}"
    );
    da.close().unwrap();
}

/// A synchronous write of a vdisk (`write_fua`) goes to every pdisk written through: when
/// it returns, no drive holds any of it in its volatile cache, and it sent no flush (an
/// earlier plain write is still cached), for a whole stripe and for a read-modify-write of
/// part of one.
#[test]
fn a_write_through_leaves_nothing_in_the_pdisks_caches() {
    let (_t, _gate, drives, da) = cached_array();
    let v = da.vdisk("v").unwrap();
    v.flush().unwrap();
    let cached = || -> Vec<(String, u64)> {
        drives
            .lock()
            .unwrap()
            .iter()
            .map(|d| (d.name().to_string(), d.unflushed_bytes()))
            .filter(|(_, b)| *b > 0)
            .collect()
    };
    assert!(cached().is_empty(), "clean after a flush: {:?}", cached());
    // A plain write stays in the caches until a flush; the writes through below send
    // none, so it is still there after them, and they leave nothing cached of their own.
    v.write_at(&pattern(8192, 13), 5 * BLOCK).unwrap();
    let plain = cached();
    assert!(!plain.is_empty(), "a plain write is cached");
    let whole = pattern(BLOCK as usize, 11);
    v.write_fua(&whole, 2 * BLOCK).unwrap();
    assert_eq!(cached(), plain, "a whole stripe written through");
    let part = pattern(8192, 12);
    v.write_fua(&part, 3 * BLOCK + 4096).unwrap();
    assert_eq!(cached(), plain, "a read-modify-write written through");
    v.flush().unwrap();
    assert!(cached().is_empty());
    assert!(read(&*v, 2 * BLOCK, BLOCK as usize).unwrap()[..] == whole[..]);
    assert!(read(&*v, 3 * BLOCK + 4096, 8192).unwrap()[..] == part[..]);
    da.close().unwrap();
}
