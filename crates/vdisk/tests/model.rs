//! Reference model: random writes and reads of random sizes and offsets against a plain
//! in-memory buffer, while pdisks fail, vanish, are suspended, resumed and replaced, bits
//! are flipped in strip files behind the array's back, and the array is reopened. With at
//! most `m` pdisks down at a time (the model waits for rebuild before taking more), every
//! read must return exactly the model's bytes.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use tessera_drive::BlockDevice;
use tessera_vdisk::{Code, DaState, DeclusteredArray, PdiskState, Vdisk, VdiskSize};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

struct World {
    t: TestPdisks,
    faults: FaultBox,
    da: Arc<DeclusteredArray>,
    v: Arc<Vdisk>,
    model: Vec<u8>,
    /// Pdisks taken down since redundancy was last fully restored.
    down: usize,
    devices: Vec<std::path::PathBuf>,
    m: usize,
    n: usize,
    replacements: usize,
}

impl World {
    fn in_service(&self) -> Vec<String> {
        self.da
            .status()
            .pdisks
            .iter()
            .filter(|p| p.state == PdiskState::Ok && !p.catching_up)
            .map(|p| p.name.clone())
            .collect()
    }

    fn restore(&mut self) {
        let st = self.da.status();
        for p in st
            .pdisks
            .iter()
            .filter(|p| p.state == PdiskState::Suspended)
        {
            self.da.pdisk_resume(&p.name).unwrap();
        }
        assert!(
            self.da.wait_idle(Duration::from_secs(60)),
            "rebuild did not finish: {:?} {:?}",
            self.da.pending_work(),
            self.da.status().events
        );
        let st = self.da.status();
        assert_eq!(
            st.state,
            DaState::Ok,
            "redundancy not restored: {:#?}",
            st.events
        );
        self.down = 0;
    }

    fn take_down(&mut self, rng: &mut Rng) {
        if self.down >= self.m {
            self.restore();
        }
        // Rebuild needs k+m distinct pdisks in service: replace a dead one first when
        // taking another away would leave too few.
        if self.in_service().len() <= self.n {
            self.replace_one(rng);
            self.restore();
        }
        // Latent corruption plus m lost pdisks would exceed the code: repair it first,
        // as a periodic scrub would.
        let r = self.da.scrub_now().unwrap();
        assert_eq!(r.unrecoverable, 0, "{r:?}");
        let names = self.in_service();
        let victim = names[rng.below(names.len() as u64) as usize].clone();
        match rng.below(3) {
            0 => self.da.pdisk_fail(&victim).unwrap(),
            1 => self.da.pdisk_suspend(&victim).unwrap(),
            _ => {
                let path = self.device_of(&victim);
                self.faults
                    .faults(&path)
                    .vanished
                    .store(true, Ordering::Relaxed);
                // The array notices on I/O; declare it for certain so a later reopen does
                // not count it as still in service.
                self.da.pdisk_fail(&victim).unwrap();
            }
        }
        self.down += 1;
    }

    fn device_of(&self, pdisk: &str) -> std::path::PathBuf {
        let st = self.da.status();
        let p = st
            .pdisks
            .iter()
            .find(|p| p.name == pdisk && p.state != PdiskState::Replaced)
            .unwrap();
        std::path::PathBuf::from(&p.device)
    }

    fn replace_one(&mut self, rng: &mut Rng) {
        let st = self.da.status();
        let dead: Vec<String> = st
            .pdisks
            .iter()
            .filter(|p| p.state == PdiskState::Dead)
            .map(|p| p.name.clone())
            .collect();
        if dead.is_empty() {
            return;
        }
        let victim = &dead[rng.below(dead.len() as u64) as usize];
        self.replacements += 1;
        let path = self
            .t
            .new_file(&format!("new{}", self.replacements), 64 * MIB);
        self.da.pdisk_replace(victim, &path).unwrap();
        self.devices.push(path);
    }

    fn corrupt(&mut self, rng: &mut Rng) {
        if self.down > 0 {
            return;
        }
        let stripe = rng.below(self.v.stripes());
        let locs = self.v.strip_locations(stripe).unwrap();
        let loc = &locs[rng.below(locs.len() as u64) as usize];
        let at = loc.data_offset + rng.below(loc.strip_bytes);
        flip_bit(std::path::Path::new(&loc.device), at, rng.below(8) as u8);
    }

    fn reopen(&mut self) {
        self.da.close().unwrap();
        self.da =
            DeclusteredArray::open_with("da1", &self.devices, &self.faults.options()).unwrap();
        self.v = self.da.vdisk("v").unwrap();
    }
}

fn run(seed: u64, code: &str, block: u64, ops: usize) {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let t = make_pdisks(12, 6, 64 * MIB);
    let faults = FaultBox::default();
    let da = create(&t, faults.options());
    let code = Code::parse(code).unwrap();
    let v = da
        .create_vdisk("v", code, block, VdiskSize::Bytes(12 * MIB))
        .unwrap();
    let size = v.size_bytes() as usize;
    let devices = t.paths();
    let mut w = World {
        t,
        faults,
        da,
        v,
        model: vec![0; size],
        down: 0,
        devices,
        m: code.parity_strips(),
        n: code.total_strips(),
        replacements: 0,
    };
    for op in 0..ops {
        match rng.below(20) {
            0..=7 => {
                let sectors = 1 + rng.below(3 * block / 4096);
                let len = (sectors * 4096) as usize;
                let off = (rng.below((size - len) as u64 / 4096) * 4096) as usize;
                let data = pattern(len, seed * 100_000 + op as u64);
                w.v.write_at(&data, off as u64).unwrap_or_else(|e| {
                    panic!(
                        "seed {seed} op {op}: write {off}+{len}: {e}\n{:#?}",
                        w.da.status().events
                    )
                });
                w.model[off..off + len].copy_from_slice(&data);
            }
            8..=13 => {
                let sectors = 1 + rng.below(3 * block / 4096);
                let len = (sectors * 4096) as usize;
                let off = (rng.below((size - len) as u64 / 4096) * 4096) as usize;
                let got = read(w.v.as_ref(), off as u64, len)
                    .unwrap_or_else(|e| panic!("seed {seed} op {op}: read {off}+{len}: {e}"));
                assert!(
                    got[..] == w.model[off..off + len],
                    "seed {seed} op {op}: read {off}+{len} differs"
                );
            }
            14 => w.v.flush().unwrap(),
            15 => w.take_down(&mut rng),
            16 => w.corrupt(&mut rng),
            17 => w.replace_one(&mut rng),
            18 => w.restore(),
            _ => {
                if rng.below(3) == 0 {
                    w.reopen();
                }
            }
        }
    }
    w.restore();
    let got = read(w.v.as_ref(), 0, size).unwrap();
    assert!(got[..] == w.model[..], "final read differs");
    let r = w.da.scrub_now().unwrap();
    assert_eq!(r.unrecoverable + r.parity_mismatches, 0, "{r:?}");
    w.da.close().unwrap();
}

/// Seeds per test: 3, or `TESSERA_MODEL_SEEDS` for longer runs.
fn seeds() -> u64 {
    std::env::var("TESSERA_MODEL_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
}

#[test]
fn model_8_2p() {
    let first = std::env::var("TESSERA_MODEL_FIRST_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    for seed in first..first + seeds() {
        run(seed, "8+2p", 128 << 10, 160);
    }
}

#[test]
fn model_4_2p_small_blocks() {
    for seed in 0..seeds().div_ceil(3) {
        run(11 + seed, "4+2p", 32 << 10, 160);
    }
}

#[test]
fn model_3way_replication() {
    for seed in 0..seeds().div_ceil(3) {
        run(21 + seed, "3WayReplication", 64 << 10, 160);
    }
}
