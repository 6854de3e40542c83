//! Erasure codes for declustered arrays: Reed-Solomon over GF(2^8) and n-way replication.
//!
//! A vdisk stripe is `k` data strips followed by `m` parity strips. [`Codec`] computes the
//! parity of a full stripe ([`Codec::encode`]), rebuilds lost strips from any `k` survivors
//! ([`Codec::reconstruct`]), and folds a small in-place data change into parity without
//! reading the rest of the stripe ([`Codec::update_parity`]).
//!
//! The parity format is fixed by [`Codec::id`] and recorded in stripe metadata, so a
//! stripe written today decodes with any later kernel. The kernels (GFNI on AVX-512, AVX2,
//! portable) are interchangeable: they produce identical bytes and are chosen per CPU at
//! run time, or forced with `TESSERA_EC_KERNEL=portable|avx2|gfni-avx512`.

pub mod bench;
mod gf;
mod kernel;

use kernel::{Kernel, Plan};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

/// Most data strips per stripe. Beyond 16 a stripe's rebuild reads too many drives and the
/// decode matrices stop fitting the kernels' register budget.
pub const MAX_DATA_STRIPS: usize = kernel::MAX_INPUTS;
/// Most parity strips per stripe; the kernels keep one accumulator set per parity strip
/// in registers.
pub const MAX_PARITY_STRIPS: usize = kernel::MAX_OUTPUTS;

const ACCEPTED: &str = "accepted: K+Mp with K in 1..=16 and M in 1..=4 (e.g. 8+2p, 8+3p, 4+2p, \
                        4+3p, 16+4p), 3WayReplication or 4WayReplication (also 3way, 4way)";

/// How a vdisk protects a stripe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Code {
    /// `copies` identical strips; survives the loss of all but one.
    Replication { copies: u8 },
    /// `k` data strips and `m` parity strips; survives the loss of any `m`.
    ReedSolomon { k: u8, m: u8 },
}

impl Code {
    /// Parses the GPFS-style names administrators already use: `8+2p`, `4+3P`,
    /// `3WayReplication` (case-insensitive; `3way` is short for `3WayReplication`).
    pub fn parse(s: &str) -> Result<Code, CodecError> {
        let bad = |reason: String| CodecError::BadCode {
            input: s.to_string(),
            reason,
        };
        let t = s.trim().to_ascii_lowercase();
        if let Some(n) = t
            .strip_suffix("wayreplication")
            .or_else(|| t.strip_suffix("way"))
        {
            let copies: u8 = n
                .parse()
                .map_err(|_| bad(format!("{n:?} is not a copy count")))?;
            let code = Code::Replication { copies };
            code.validate().map_err(&bad)?;
            return Ok(code);
        }
        let body = t
            .strip_suffix('p')
            .ok_or_else(|| bad("neither K+Mp nor NWayReplication".to_string()))?;
        let (k, m) = body
            .split_once('+')
            .ok_or_else(|| bad("expected K+Mp, e.g. 8+2p".to_string()))?;
        let k: u8 = k
            .trim()
            .parse()
            .map_err(|_| bad(format!("data strip count {k:?} is not a number")))?;
        let m: u8 = m
            .trim()
            .parse()
            .map_err(|_| bad(format!("parity strip count {m:?} is not a number")))?;
        let code = Code::ReedSolomon { k, m };
        code.validate().map_err(&bad)?;
        Ok(code)
    }

    fn validate(&self) -> Result<(), String> {
        match *self {
            Code::Replication { copies } if !(3..=4).contains(&copies) => {
                Err(format!("{copies}-way replication is not supported"))
            }
            Code::ReedSolomon { k, .. } if !(1..=MAX_DATA_STRIPS).contains(&(k as usize)) => {
                Err(format!("{k} data strips is outside 1..={MAX_DATA_STRIPS}"))
            }
            Code::ReedSolomon { m, .. } if !(1..=MAX_PARITY_STRIPS).contains(&(m as usize)) => Err(
                format!("{m} parity strips is outside 1..={MAX_PARITY_STRIPS}"),
            ),
            _ => Ok(()),
        }
    }

    /// Strips that carry user data: `k`, or 1 for replication.
    pub fn data_strips(&self) -> usize {
        match *self {
            Code::Replication { .. } => 1,
            Code::ReedSolomon { k, .. } => k as usize,
        }
    }

    /// Redundant strips: `m`, or the extra copies.
    pub fn parity_strips(&self) -> usize {
        match *self {
            Code::Replication { copies } => copies as usize - 1,
            Code::ReedSolomon { m, .. } => m as usize,
        }
    }

    pub fn total_strips(&self) -> usize {
        self.data_strips() + self.parity_strips()
    }

    /// Strips that may be lost with the stripe still readable.
    pub fn fault_tolerance(&self) -> usize {
        self.parity_strips()
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Code::Replication { copies } => write!(f, "{copies}WayReplication"),
            Code::ReedSolomon { k, m } => write!(f, "{k}+{m}p"),
        }
    }
}

impl std::str::FromStr for Code {
    type Err = CodecError;
    fn from_str(s: &str) -> Result<Code, CodecError> {
        Code::parse(s)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("invalid erasure code {input:?}: {reason}; {ACCEPTED}")]
    BadCode { input: String, reason: String },
    #[error("{code} needs {expected} {what} strips, got {got}")]
    StripCount {
        code: Code,
        what: &'static str,
        expected: usize,
        got: usize,
    },
    #[error("strips of one stripe must have equal length: {what} {index} has {got} bytes, expected {expected}")]
    StripLength {
        what: &'static str,
        index: usize,
        expected: usize,
        got: usize,
    },
    #[error("stripe of {code} has {lost} strips missing but survives at most {tolerance}: the data cannot be rebuilt from this stripe alone")]
    TooManyLost {
        code: Code,
        lost: usize,
        tolerance: usize,
    },
    #[error("data strip index {index} is out of range for {code} (0..{data_strips})")]
    DataIndex {
        code: Code,
        index: usize,
        data_strips: usize,
    },
    #[error(
        "unknown codec kernel {name:?} in TESSERA_EC_KERNEL; use gfni-avx512, avx2 or portable"
    )]
    UnknownKernel { name: String },
    #[error("codec kernel {name} is not supported by this CPU; available here: {available}")]
    KernelUnavailable {
        name: &'static str,
        available: String,
    },
}

/// Parity format ids recorded in stripe metadata; never renumber.
const ID_REED_SOLOMON: u8 = 1;
const ID_REPLICATION: u8 = 2;

/// Decode plans kept per codec. A stripe of `16+4p` has 6195 recoverable erasure patterns;
/// a failing array sees only a few at a time, so a small cache that is dropped when full
/// keeps rebuild off the matrix-inversion path without growing without bound.
const DECODE_CACHE_ENTRIES: usize = 256;

/// Encoder/decoder for one [`Code`]. Cheap to clone (shared state); `Send + Sync`.
#[derive(Clone, Debug)]
pub struct Codec {
    code: Code,
    kernel: Kernel,
    rs: Option<Arc<ReedSolomon>>,
}

#[derive(Debug)]
struct ReedSolomon {
    /// (k+m) x k; top k rows are the identity.
    matrix: gf::Matrix,
    encode: Plan,
    /// One per data strip: m outputs from inputs (old, new), both with that strip's column.
    update: Vec<Plan>,
    /// Keyed by the bit mask of present strips.
    decode: Mutex<HashMap<u32, Arc<Plan>>>,
}

impl Codec {
    /// Builds a codec with the fastest kernel of this CPU, or the one `TESSERA_EC_KERNEL`
    /// names.
    pub fn new(code: Code) -> Result<Codec, CodecError> {
        Codec::build(code, Kernel::select()?)
    }

    /// Builds a codec with a named kernel (`gfni-avx512`, `avx2`, `portable`); an error if
    /// the CPU cannot run it. For tests and benchmarks that compare kernels.
    pub fn with_kernel(code: Code, kernel: &str) -> Result<Codec, CodecError> {
        Codec::build(code, Kernel::from_name(kernel)?)
    }

    /// Kernels this CPU can run, fastest first.
    pub fn available_kernels() -> Vec<&'static str> {
        Kernel::ALL
            .into_iter()
            .filter(|k| k.available())
            .map(|k| k.name())
            .collect()
    }

    fn build(code: Code, kernel: Kernel) -> Result<Codec, CodecError> {
        code.validate().map_err(|reason| CodecError::BadCode {
            input: format!("{code:?}"),
            reason,
        })?;
        let rs = match code {
            Code::Replication { .. } => None,
            Code::ReedSolomon { k, m } => {
                let (k, m) = (k as usize, m as usize);
                let matrix = gf::encoding_matrix(k, m);
                let parity_rows: Vec<u8> =
                    (k..k + m).flat_map(|r| matrix.row(r).to_vec()).collect();
                let encode = Plan::new(kernel, m, k, parity_rows);
                let update = (0..k)
                    .map(|d| {
                        let coefs = (k..k + m).flat_map(|r| [matrix.get(r, d); 2]).collect();
                        Plan::new(kernel, m, 2, coefs)
                    })
                    .collect();
                Some(Arc::new(ReedSolomon {
                    matrix,
                    encode,
                    update,
                    decode: Mutex::default(),
                }))
            }
        };
        Ok(Codec { code, kernel, rs })
    }

    pub fn code(&self) -> Code {
        self.code
    }

    /// Stable id of the parity format, recorded by vdisks in stripe metadata: 1 =
    /// Reed-Solomon GF(2^8) poly 0x11D, systematic Vandermonde matrix (byte-compatible with
    /// klauspost/reedsolomon and the reed-solomon-erasure crate); 2 = n-way replication.
    pub fn id(&self) -> u8 {
        match self.code {
            Code::Replication { .. } => ID_REPLICATION,
            Code::ReedSolomon { .. } => ID_REED_SOLOMON,
        }
    }

    /// Name of the SIMD kernel in use: "gfni-avx512", "avx2", "portable".
    pub fn kernel(&self) -> &'static str {
        self.kernel.name()
    }

    /// data: k slices, parity: m slices, all the same length (any length; fastest when a
    /// multiple of 64).
    pub fn encode(&self, data: &[&[u8]], parity: &mut [&mut [u8]]) -> Result<(), CodecError> {
        self.check_count("data", self.code.data_strips(), data.len())?;
        self.check_count("parity", self.code.parity_strips(), parity.len())?;
        let len = data[0].len();
        check_lengths("data strip", len, data.iter().map(|s| s.len()))?;
        check_lengths("parity strip", len, parity.iter().map(|s| s.len()))?;
        match &self.rs {
            None => parity.iter_mut().for_each(|p| p.copy_from_slice(data[0])),
            Some(rs) => rs.encode.apply(data, parity, false),
        }
        Ok(())
    }

    /// strips: total_strips() slices of equal length, data first then parity. Recomputes
    /// every strip whose `present[i]` is false from the present ones. Error (nothing
    /// modified) if more than m are absent.
    pub fn reconstruct(
        &self,
        strips: &mut [&mut [u8]],
        present: &[bool],
    ) -> Result<(), CodecError> {
        let total = self.code.total_strips();
        self.check_count("", total, strips.len())?;
        self.check_count("presence flags for", total, present.len())?;
        let len = strips[0].len();
        check_lengths("strip", len, strips.iter().map(|s| s.len()))?;
        let lost = present.iter().filter(|&&p| !p).count();
        if lost > self.code.fault_tolerance() {
            return Err(CodecError::TooManyLost {
                code: self.code,
                lost,
                tolerance: self.code.fault_tolerance(),
            });
        }
        if lost == 0 {
            return Ok(());
        }
        let Some(rs) = &self.rs else {
            let source = present
                .iter()
                .position(|&p| p)
                .expect("at least one copy survives");
            for i in (0..total).filter(|&i| !present[i]) {
                let (dst, src) = if i < source {
                    let (lo, hi) = strips.split_at_mut(source);
                    (&mut *lo[i], &*hi[0])
                } else {
                    let (lo, hi) = strips.split_at_mut(i);
                    (&mut *hi[0], &*lo[source])
                };
                dst.copy_from_slice(src);
            }
            return Ok(());
        };
        let plan = rs.decode_plan(present);
        let k = self.code.data_strips();
        let mut inputs: Vec<&[u8]> = Vec::with_capacity(k);
        let mut outputs: Vec<&mut [u8]> = Vec::with_capacity(lost);
        for (strip, &here) in strips.iter_mut().zip(present) {
            if !here {
                outputs.push(&mut **strip);
            } else if inputs.len() < k {
                inputs.push(&**strip);
            }
        }
        plan.apply(&inputs, &mut outputs, false);
        Ok(())
    }

    /// Read-modify-write of one data strip range: parity[j] ^= coef(j, data_index) * (old ^
    /// new), for every parity strip. old/new/parity same length.
    pub fn update_parity(
        &self,
        data_index: usize,
        old: &[u8],
        new: &[u8],
        parity: &mut [&mut [u8]],
    ) -> Result<(), CodecError> {
        let k = self.code.data_strips();
        if data_index >= k {
            return Err(CodecError::DataIndex {
                code: self.code,
                index: data_index,
                data_strips: k,
            });
        }
        self.check_count("parity", self.code.parity_strips(), parity.len())?;
        check_lengths("new data range", old.len(), [new.len()].into_iter())?;
        check_lengths("parity range", old.len(), parity.iter().map(|s| s.len()))?;
        match &self.rs {
            None => {
                for p in parity.iter_mut() {
                    for ((p, &o), &n) in p.iter_mut().zip(old).zip(new) {
                        *p ^= o ^ n;
                    }
                }
            }
            Some(rs) => rs.update[data_index].apply(&[old, new], parity, true),
        }
        Ok(())
    }

    fn check_count(
        &self,
        what: &'static str,
        expected: usize,
        got: usize,
    ) -> Result<(), CodecError> {
        if expected == got {
            Ok(())
        } else {
            Err(CodecError::StripCount {
                code: self.code,
                what,
                expected,
                got,
            })
        }
    }
}

fn check_lengths(
    what: &'static str,
    expected: usize,
    lens: impl Iterator<Item = usize>,
) -> Result<(), CodecError> {
    for (index, got) in lens.enumerate() {
        if got != expected {
            return Err(CodecError::StripLength {
                what,
                index,
                expected,
                got,
            });
        }
    }
    Ok(())
}

impl ReedSolomon {
    fn decode_plan(&self, present: &[bool]) -> Arc<Plan> {
        let mask = present
            .iter()
            .enumerate()
            .fold(0u32, |m, (i, &p)| m | (p as u32) << i);
        let mut cache = self.decode.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(plan) = cache.get(&mask) {
            return plan.clone();
        }
        let plan = Arc::new(self.build_decode_plan(present));
        if cache.len() >= DECODE_CACHE_ENTRIES {
            cache.clear();
        }
        cache.insert(mask, plan.clone());
        plan
    }

    /// Expresses every missing strip directly in terms of the first k survivors: row r of
    /// the encoding matrix times the inverse of the survivors' rows. Lost parity is thus
    /// rebuilt in the same single pass as lost data.
    fn build_decode_plan(&self, present: &[bool]) -> Plan {
        let k = self.matrix.cols;
        let survivors: Vec<usize> = (0..present.len()).filter(|&i| present[i]).take(k).collect();
        assert_eq!(survivors.len(), k, "caller checked fault tolerance");
        let inverse = self
            .matrix
            .select_rows(&survivors)
            .invert()
            .expect("any k rows of the encoding matrix are independent");
        let missing: Vec<usize> = (0..present.len()).filter(|&i| !present[i]).collect();
        let rows = self.matrix.select_rows(&missing).multiply(&inverse);
        Plan::new(self.encode_kernel(), missing.len(), k, rows.cells)
    }

    fn encode_kernel(&self) -> Kernel {
        self.encode.kernel()
    }
}
