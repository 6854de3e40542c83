//! Identify data structures (NVMe Base 2.0, 5.17.2): Identify Controller (CNS 0x01),
//! Identify Namespace (CNS 0x00, NVM Command Set 1.0, 4.1.5.1), the Active Namespace ID list
//! (CNS 0x02) and the Namespace Identification Descriptor list (CNS 0x03). Each is 4096 bytes.
//!
//! Offsets follow the specification and were checked against Linux `struct nvme_id_ctrl` and
//! `struct nvme_id_ns`.

use super::bytes::{get_u16, get_u32, get_u64, put_u16, put_u32, put_u64};
use super::error::{invalid, need, WireError};
use super::text::{FixedAscii, Nqn};

/// Size of every Identify data structure.
pub const IDENTIFY_BYTES: usize = 4096;

/// CMIC bits (byte 76).
pub mod cmic {
    /// The subsystem may have more than one port.
    pub const MULTI_PORT: u8 = 1 << 0;
    /// The subsystem may have more than one controller.
    pub const MULTI_CONTROLLER: u8 = 1 << 1;
    /// The controller reports Asymmetric Namespace Access (the ANA log page).
    pub const ANA_REPORTING: u8 = 1 << 3;
}

/// ONCS bits (bytes 521:520): optional NVM commands supported.
pub mod oncs {
    /// Compare.
    pub const COMPARE: u16 = 1 << 0;
    /// Write Uncorrectable.
    pub const WRITE_UNCORRECTABLE: u16 = 1 << 1;
    /// Dataset Management.
    pub const DSM: u16 = 1 << 2;
    /// Write Zeroes.
    pub const WRITE_ZEROES: u16 = 1 << 3;
    /// Save field in Set Features and Select field in Get Features.
    pub const SAVE_SELECT: u16 = 1 << 4;
    /// Reservations.
    pub const RESERVATIONS: u16 = 1 << 5;
}

/// SGLS bits (bytes 539:536).
pub mod sgls {
    /// SGLs supported, no alignment requirement (bits 1:0 = 01b); Fabrics requires it.
    pub const SUPPORTED: u32 = 0b01;
    /// Keyed SGL Data Block descriptors (RDMA).
    pub const KEYED: u32 = 1 << 2;
    /// The address field of a data block descriptor may be an offset (bit 20); NVMe/TCP
    /// in-capsule data uses it.
    pub const OFFSET: u32 = 1 << 20;
}

/// Controller types (CNTRLTYPE, byte 111).
pub mod cntrltype {
    /// I/O controller.
    pub const IO: u8 = 1;
    /// Discovery controller.
    pub const DISCOVERY: u8 = 2;
    /// Administrative controller.
    pub const ADMIN: u8 = 3;
}

/// Identify Controller data structure: the fields a Fabrics target fills and a host reads.
/// Fields not listed are encoded as zero.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IdentifyController {
    /// PCI Vendor ID (bytes 1:0).
    pub vid: u16,
    /// PCI Subsystem Vendor ID (bytes 3:2).
    pub ssvid: u16,
    /// Serial Number (bytes 23:4), ASCII.
    pub sn: FixedAscii<20>,
    /// Model Number (bytes 63:24), ASCII.
    pub mn: FixedAscii<40>,
    /// Firmware Revision (bytes 71:64), ASCII.
    pub fr: FixedAscii<8>,
    /// Recommended Arbitration Burst (byte 72).
    pub rab: u8,
    /// IEEE OUI (bytes 75:73).
    pub ieee: [u8; 3],
    /// Multi-path I/O and namespace sharing capabilities (byte 76), see [`cmic`].
    pub cmic: u8,
    /// Maximum Data Transfer Size (byte 77): 2^MDTS minimum memory pages; 0 = no limit.
    pub mdts: u8,
    /// Controller ID (bytes 79:78).
    pub cntlid: u16,
    /// Version (bytes 83:80), see [`super::fabrics::version`].
    pub ver: u32,
    /// RTD3 Resume Latency in microseconds (bytes 87:84).
    pub rtd3r: u32,
    /// RTD3 Entry Latency in microseconds (bytes 91:88).
    pub rtd3e: u32,
    /// Optional Asynchronous Events Supported (bytes 95:92); bit 11 = ANA change.
    pub oaes: u32,
    /// Controller Attributes (bytes 99:96).
    pub ctratt: u32,
    /// Controller Type (byte 111), see [`cntrltype`].
    pub cntrltype: u8,
    /// Optional Admin Command Support (bytes 257:256).
    pub oacs: u16,
    /// Abort Command Limit, 0's based (byte 258).
    pub acl: u8,
    /// Asynchronous Event Request Limit, 0's based (byte 259).
    pub aerl: u8,
    /// Firmware Updates (byte 260).
    pub frmw: u8,
    /// Log Page Attributes (byte 261); bit 2 = extended data for Get Log Page (NUMDU, offset).
    pub lpa: u8,
    /// Error Log Page Entries, 0's based (byte 262).
    pub elpe: u8,
    /// Number of Power States Support, 0's based (byte 263).
    pub npss: u8,
    /// Keep Alive Support (bytes 321:320): granularity in 100 ms units; 0 = unsupported.
    pub kas: u16,
    /// ANA Transition Time in seconds (byte 342).
    pub anatt: u8,
    /// ANA Capabilities (byte 343).
    pub anacap: u8,
    /// ANA Group Identifier Maximum (bytes 347:344).
    pub anagrpmax: u32,
    /// Number of ANA Group Identifiers (bytes 351:348).
    pub nanagrpid: u32,
    /// SQ entry size (byte 512): required (bits 3:0) and maximum (bits 7:4), log2; 0x66.
    pub sqes: u8,
    /// CQ entry size (byte 513); 0x44.
    pub cqes: u8,
    /// Maximum Outstanding Commands (bytes 515:514).
    pub maxcmd: u16,
    /// Number of Namespaces: the largest valid NSID (bytes 519:516).
    pub nn: u32,
    /// Optional NVM Command Support (bytes 521:520), see [`oncs`].
    pub oncs: u16,
    /// Fused Operation Support (bytes 523:522).
    pub fuses: u16,
    /// Format NVM Attributes (byte 524).
    pub fna: u8,
    /// Volatile Write Cache (byte 525): bit 0 present; bits 2:1 = 11b Flush with NSID
    /// 0xFFFFFFFF supported.
    pub vwc: u8,
    /// Atomic Write Unit Normal, 0's based blocks (bytes 527:526).
    pub awun: u16,
    /// Atomic Write Unit Power Fail, 0's based blocks (bytes 529:528).
    pub awupf: u16,
    /// SGL Support (bytes 539:536), see [`sgls`].
    pub sgls: u32,
    /// Maximum Number of Allowed Namespaces (bytes 543:540).
    pub mnan: u32,
    /// NVM Subsystem NQN (bytes 1023:768).
    pub subnqn: Option<Nqn>,
    /// I/O Queue Command Capsule Supported Size in 16-byte units (bytes 1795:1792); 4 means
    /// no in-capsule data beyond the 64-byte SQE.
    pub ioccsz: u32,
    /// I/O Queue Response Capsule Supported Size in 16-byte units (bytes 1799:1796); 1.
    pub iorcsz: u32,
    /// In Capsule Data Offset in 16-byte units (bytes 1801:1800); 0 for NVMe/TCP.
    pub icdoff: u16,
    /// Fabrics Controller Attributes (byte 1802): bit 0 = static controller model.
    pub fcatt: u8,
    /// Maximum SGL Data Block Descriptors (byte 1803); 1 for NVMe/TCP.
    pub msdbd: u8,
}

impl IdentifyController {
    /// Encodes to 4096 bytes.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; IDENTIFY_BYTES];
        put_u16(&mut b, 0, self.vid);
        put_u16(&mut b, 2, self.ssvid);
        self.sn.write(&mut b[4..]);
        self.mn.write(&mut b[24..]);
        self.fr.write(&mut b[64..]);
        b[72] = self.rab;
        b[73..76].copy_from_slice(&self.ieee);
        b[76] = self.cmic;
        b[77] = self.mdts;
        put_u16(&mut b, 78, self.cntlid);
        put_u32(&mut b, 80, self.ver);
        put_u32(&mut b, 84, self.rtd3r);
        put_u32(&mut b, 88, self.rtd3e);
        put_u32(&mut b, 92, self.oaes);
        put_u32(&mut b, 96, self.ctratt);
        b[111] = self.cntrltype;
        self.encode_admin_fields(&mut b);
        self.encode_nvm_fields(&mut b);
        if let Some(nqn) = &self.subnqn {
            nqn.write(&mut b[768..]);
        }
        put_u32(&mut b, 1792, self.ioccsz);
        put_u32(&mut b, 1796, self.iorcsz);
        put_u16(&mut b, 1800, self.icdoff);
        b[1802] = self.fcatt;
        b[1803] = self.msdbd;
        b
    }

    fn encode_admin_fields(&self, b: &mut [u8]) {
        put_u16(b, 256, self.oacs);
        b[258] = self.acl;
        b[259] = self.aerl;
        b[260] = self.frmw;
        b[261] = self.lpa;
        b[262] = self.elpe;
        b[263] = self.npss;
        put_u16(b, 320, self.kas);
        b[342] = self.anatt;
        b[343] = self.anacap;
        put_u32(b, 344, self.anagrpmax);
        put_u32(b, 348, self.nanagrpid);
    }

    fn encode_nvm_fields(&self, b: &mut [u8]) {
        b[512] = self.sqes;
        b[513] = self.cqes;
        put_u16(b, 514, self.maxcmd);
        put_u32(b, 516, self.nn);
        put_u16(b, 520, self.oncs);
        put_u16(b, 522, self.fuses);
        b[524] = self.fna;
        b[525] = self.vwc;
        put_u16(b, 526, self.awun);
        put_u16(b, 528, self.awupf);
        put_u32(b, 536, self.sgls);
        put_u32(b, 540, self.mnan);
    }

    /// Decodes the first 4096 bytes of `data`. An all-zero SUBNQN decodes as `None` (some
    /// PCIe controllers leave it empty); anything else must be a valid NQN.
    ///
    /// # Errors
    /// [`WireError::Short`] or a text field error naming the field.
    pub fn decode(data: &[u8]) -> Result<Self, WireError> {
        const WHAT: &str = "Identify Controller";
        need(WHAT, data, IDENTIFY_BYTES)?;
        let b = &data[..IDENTIFY_BYTES];
        let subnqn = if b[768] == 0 {
            None
        } else {
            Some(Nqn::decode_at(b, 768, WHAT, "SUBNQN")?)
        };
        Ok(IdentifyController {
            vid: get_u16(b, 0),
            ssvid: get_u16(b, 2),
            sn: FixedAscii::decode_at(b, 4, WHAT, "SN")?,
            mn: FixedAscii::decode_at(b, 24, WHAT, "MN")?,
            fr: FixedAscii::decode_at(b, 64, WHAT, "FR")?,
            rab: b[72],
            ieee: [b[73], b[74], b[75]],
            cmic: b[76],
            mdts: b[77],
            cntlid: get_u16(b, 78),
            ver: get_u32(b, 80),
            rtd3r: get_u32(b, 84),
            rtd3e: get_u32(b, 88),
            oaes: get_u32(b, 92),
            ctratt: get_u32(b, 96),
            cntrltype: b[111],
            oacs: get_u16(b, 256),
            acl: b[258],
            aerl: b[259],
            frmw: b[260],
            lpa: b[261],
            elpe: b[262],
            npss: b[263],
            kas: get_u16(b, 320),
            anatt: b[342],
            anacap: b[343],
            anagrpmax: get_u32(b, 344),
            nanagrpid: get_u32(b, 348),
            sqes: b[512],
            cqes: b[513],
            maxcmd: get_u16(b, 514),
            nn: get_u32(b, 516),
            oncs: get_u16(b, 520),
            fuses: get_u16(b, 522),
            fna: b[524],
            vwc: b[525],
            awun: get_u16(b, 526),
            awupf: get_u16(b, 528),
            sgls: get_u32(b, 536),
            mnan: get_u32(b, 540),
            subnqn,
            ioccsz: get_u32(b, 1792),
            iorcsz: get_u32(b, 1796),
            icdoff: get_u16(b, 1800),
            fcatt: b[1802],
            msdbd: b[1803],
        })
    }

    /// Bytes of in-capsule data an I/O command capsule may carry (IOCCSZ * 16 - 64), or 0.
    #[must_use]
    pub fn in_capsule_data_bytes(&self) -> u64 {
        (u64::from(self.ioccsz) * 16).saturating_sub(64)
    }
}

/// An LBA Format entry (Identify Namespace bytes 128 + 4n).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LbaFormat {
    /// Metadata Size in bytes per block (bits 15:0).
    pub ms: u16,
    /// LBA Data Size as log2 of bytes (bits 23:16): 9 = 512, 12 = 4096.
    pub lbads: u8,
    /// Relative Performance (bits 25:24).
    pub rp: u8,
}

/// Most LBA formats an Identify Namespace holds (NLBAF is at most 63).
pub const LBA_FORMATS_MAX: usize = 64;

/// NMIC bit 0: the namespace may be attached to more than one controller.
pub const NMIC_SHARED: u8 = 1 << 0;

/// Identify Namespace data structure (NVM command set).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IdentifyNamespace {
    /// Namespace Size in blocks (bytes 7:0).
    pub nsze: u64,
    /// Namespace Capacity in blocks (bytes 15:8).
    pub ncap: u64,
    /// Namespace Utilization in blocks (bytes 23:16).
    pub nuse: u64,
    /// Namespace Features (byte 24): bit 0 thin provisioning.
    pub nsfeat: u8,
    /// Formatted LBA Size (byte 26): bits 3:0 the low bits of the format index, bit 4
    /// metadata at the end of the block, bits 6:5 the high bits of the format index.
    pub flbas: u8,
    /// Multi-path I/O and Namespace Sharing Capabilities (byte 30), see [`NMIC_SHARED`].
    pub nmic: u8,
    /// Reservation Capabilities (byte 31): bit 0 persist through power loss, bits 1-6 the
    /// reservation types, bit 7 ignore existing key.
    pub rescap: u8,
    /// Deallocate Logical Block Features (byte 33): bits 2:0 = 001b deallocated blocks
    /// read as zero.
    pub dlfeat: u8,
    /// ANA Group Identifier (bytes 95:92).
    pub anagrpid: u32,
    /// Namespace Attributes (byte 99): bit 0 write protected.
    pub nsattr: u8,
    /// Namespace Globally Unique Identifier (bytes 119:104).
    pub nguid: [u8; 16],
    /// IEEE Extended Unique Identifier (bytes 127:120).
    pub eui64: [u8; 8],
    /// LBA formats; NLBAF (byte 25) is encoded as `lbaf.len() - 1`. At most
    /// [`LBA_FORMATS_MAX`] are encoded; an empty list encodes one all-zero format.
    pub lbaf: Vec<LbaFormat>,
}

impl IdentifyNamespace {
    /// Encodes to 4096 bytes.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; IDENTIFY_BYTES];
        put_u64(&mut b, 0, self.nsze);
        put_u64(&mut b, 8, self.ncap);
        put_u64(&mut b, 16, self.nuse);
        b[24] = self.nsfeat;
        let formats = &self.lbaf[..self.lbaf.len().min(LBA_FORMATS_MAX)];
        b[25] = formats.len().saturating_sub(1) as u8;
        b[26] = self.flbas;
        b[30] = self.nmic;
        b[31] = self.rescap;
        b[33] = self.dlfeat;
        put_u32(&mut b, 92, self.anagrpid);
        b[99] = self.nsattr;
        b[104..120].copy_from_slice(&self.nguid);
        b[120..128].copy_from_slice(&self.eui64);
        for (i, f) in formats.iter().enumerate() {
            let v = u32::from(f.ms) | u32::from(f.lbads) << 16 | u32::from(f.rp & 3) << 24;
            put_u32(&mut b, 128 + 4 * i, v);
        }
        b
    }

    /// Decodes the first 4096 bytes of `data`.
    ///
    /// # Errors
    /// [`WireError::Short`], or [`WireError::InvalidField`] when NLBAF exceeds 63.
    pub fn decode(data: &[u8]) -> Result<Self, WireError> {
        const WHAT: &str = "Identify Namespace";
        need(WHAT, data, IDENTIFY_BYTES)?;
        let b = &data[..IDENTIFY_BYTES];
        let count = usize::from(b[25]) + 1;
        if count > LBA_FORMATS_MAX {
            return Err(invalid(WHAT, "NLBAF", 25, u64::from(b[25]), "at most 63"));
        }
        let lbaf = (0..count)
            .map(|i| {
                let v = get_u32(b, 128 + 4 * i);
                LbaFormat {
                    ms: v as u16,
                    lbads: (v >> 16) as u8,
                    rp: ((v >> 24) & 3) as u8,
                }
            })
            .collect();
        let mut nguid = [0u8; 16];
        nguid.copy_from_slice(&b[104..120]);
        let mut eui64 = [0u8; 8];
        eui64.copy_from_slice(&b[120..128]);
        Ok(IdentifyNamespace {
            nsze: get_u64(b, 0),
            ncap: get_u64(b, 8),
            nuse: get_u64(b, 16),
            nsfeat: b[24],
            flbas: b[26],
            nmic: b[30],
            rescap: b[31],
            dlfeat: b[33],
            anagrpid: get_u32(b, 92),
            nsattr: b[99],
            nguid,
            eui64,
            lbaf,
        })
    }

    /// Index of the LBA format in use (FLBAS bits 3:0, plus bits 6:5 as bits 5:4).
    #[must_use]
    pub fn format_index(&self) -> usize {
        usize::from(self.flbas & 0xf) | usize::from((self.flbas >> 5) & 0x3) << 4
    }

    /// Size in bytes of one logical block of the format in use.
    ///
    /// # Errors
    /// [`WireError::InvalidField`] when FLBAS selects a format that is not listed or whose
    /// LBADS is outside 9..=16 (512 B to 64 KiB).
    pub fn block_bytes(&self) -> Result<u32, WireError> {
        const WHAT: &str = "Identify Namespace";
        let index = self.format_index();
        let format = self.lbaf.get(index).ok_or_else(|| {
            invalid(
                WHAT,
                "FLBAS",
                26,
                u64::from(self.flbas),
                "selects a format not listed",
            )
        })?;
        if !(9..=16).contains(&format.lbads) {
            let offset = 128 + 4 * index + 2;
            return Err(invalid(
                WHAT,
                "LBADS",
                offset,
                u64::from(format.lbads),
                "9..=16",
            ));
        }
        Ok(1 << format.lbads)
    }
}

/// Most NSIDs one Active Namespace ID list holds.
pub const NSID_LIST_MAX: usize = IDENTIFY_BYTES / 4;

/// Encodes an Active Namespace ID list (CNS 0x02): increasing NSIDs, zero-terminated. At most
/// [`NSID_LIST_MAX`] are encoded; NSID 0 entries are dropped since 0 ends the list.
#[must_use]
pub fn encode_nsid_list(nsids: &[u32]) -> Vec<u8> {
    let mut sorted: Vec<u32> = nsids.iter().copied().filter(|&n| n != 0).collect();
    sorted.sort_unstable();
    sorted.dedup();
    let mut b = vec![0u8; IDENTIFY_BYTES];
    for (i, nsid) in sorted.iter().take(NSID_LIST_MAX).enumerate() {
        put_u32(&mut b, 4 * i, *nsid);
    }
    b
}

/// Decodes an Active Namespace ID list, stopping at the first zero.
///
/// # Errors
/// [`WireError::Short`] below 4096 bytes, [`WireError::InvalidField`] when the NSIDs are not
/// strictly increasing (the specification requires it, and a host scanning namespaces relies
/// on it to continue from the last one).
pub fn decode_nsid_list(data: &[u8]) -> Result<Vec<u32>, WireError> {
    const WHAT: &str = "Active Namespace ID list";
    need(WHAT, data, IDENTIFY_BYTES)?;
    let mut out = Vec::new();
    for i in 0..NSID_LIST_MAX {
        let nsid = get_u32(data, 4 * i);
        if nsid == 0 {
            break;
        }
        if out.last().is_some_and(|&last| nsid <= last) {
            return Err(invalid(
                WHAT,
                "NSID",
                4 * i,
                u64::from(nsid),
                "must increase",
            ));
        }
        out.push(nsid);
    }
    Ok(out)
}

/// A Namespace Identification Descriptor (CNS 0x03).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NsIdDescriptor {
    /// IEEE EUI-64 (NIDT 1, 8 bytes).
    Eui64([u8; 8]),
    /// Namespace GUID (NIDT 2, 16 bytes).
    Nguid([u8; 16]),
    /// Namespace UUID (NIDT 3, 16 bytes).
    Uuid([u8; 16]),
    /// Command Set Identifier (NIDT 4, 1 byte): 0 = NVM.
    Csi(u8),
}

impl NsIdDescriptor {
    fn type_and_bytes(&self) -> (u8, &[u8]) {
        match self {
            NsIdDescriptor::Eui64(v) => (1, v),
            NsIdDescriptor::Nguid(v) => (2, v),
            NsIdDescriptor::Uuid(v) => (3, v),
            NsIdDescriptor::Csi(v) => (4, std::slice::from_ref(v)),
        }
    }

    /// Encodes a descriptor list into 4096 bytes: per descriptor NIDT (byte 0), NIDL (byte 1),
    /// two reserved bytes, then NIDL bytes. Descriptors that do not fit are dropped.
    #[must_use]
    pub fn encode_list(descriptors: &[NsIdDescriptor]) -> Vec<u8> {
        let mut b = vec![0u8; IDENTIFY_BYTES];
        let mut at = 0;
        for d in descriptors {
            let (nidt, bytes) = d.type_and_bytes();
            // Keep 4 zero bytes at the end so the list is always terminated.
            if at + 4 + bytes.len() + 4 > IDENTIFY_BYTES {
                break;
            }
            b[at] = nidt;
            b[at + 1] = bytes.len() as u8;
            b[at + 4..at + 4 + bytes.len()].copy_from_slice(bytes);
            at += 4 + bytes.len();
        }
        b
    }

    /// Decodes a descriptor list, stopping at NIDT 0 or the end of the buffer. Unknown
    /// descriptor types are skipped, as the specification asks of hosts.
    ///
    /// # Errors
    /// [`WireError::InvalidField`] when NIDL does not match a known NIDT or runs past the
    /// buffer.
    pub fn decode_list(data: &[u8]) -> Result<Vec<NsIdDescriptor>, WireError> {
        const WHAT: &str = "Namespace Identification Descriptor list";
        let data = &data[..data.len().min(IDENTIFY_BYTES)];
        let mut out = Vec::new();
        let mut at = 0;
        while at + 4 <= data.len() && data[at] != 0 {
            let (nidt, nidl) = (data[at], usize::from(data[at + 1]));
            let body = data.get(at + 4..at + 4 + nidl).ok_or_else(|| {
                invalid(
                    WHAT,
                    "NIDL",
                    at + 1,
                    nidl as u64,
                    "runs past the end of the list",
                )
            })?;
            let expected = match nidt {
                1 => Some(8),
                2 | 3 => Some(16),
                4 => Some(1),
                _ => None,
            };
            if expected.is_some_and(|len| len != nidl) {
                return Err(invalid(WHAT, "NIDL", at + 1, nidl as u64, "wrong for NIDT"));
            }
            match nidt {
                1 => out.push(NsIdDescriptor::Eui64(super::bytes::array(body, 0))),
                2 => out.push(NsIdDescriptor::Nguid(super::bytes::array(body, 0))),
                3 => out.push(NsIdDescriptor::Uuid(super::bytes::array(body, 0))),
                4 => out.push(NsIdDescriptor::Csi(body[0])),
                _ => {}
            }
            at += 4 + nidl;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controller_offsets() {
        let ctrl = IdentifyController {
            sn: FixedAscii::new("SN1").unwrap(),
            mn: FixedAscii::new("Tessera").unwrap(),
            cntlid: 0x1234,
            kas: 1,
            anatt: 10,
            anacap: 0x47,
            anagrpmax: 0x0102_0304,
            nanagrpid: 0x0506_0708,
            oncs: oncs::DSM | oncs::WRITE_ZEROES | oncs::RESERVATIONS,
            subnqn: Some(Nqn::new("nqn.2024-01.io.tessera:drive0").unwrap()),
            ioccsz: 4,
            iorcsz: 1,
            msdbd: 1,
            ..IdentifyController::default()
        };
        let b = ctrl.encode();
        assert_eq!(&b[4..8], b"SN1 ");
        assert_eq!(&b[78..80], &[0x34, 0x12]);
        assert_eq!((b[342], b[343]), (10, 0x47));
        assert_eq!(&b[344..352], &[4, 3, 2, 1, 8, 7, 6, 5]);
        assert_eq!(&b[520..522], &[0x2c, 0]);
        assert_eq!(&b[768..772], b"nqn.");
        assert_eq!((b[1792], b[1796], b[1803]), (4, 1, 1));
        assert_eq!(IdentifyController::decode(&b).unwrap(), ctrl);
    }

    #[test]
    fn namespace_block_size() {
        let ns = IdentifyNamespace {
            nsze: 1 << 20,
            flbas: 1,
            lbaf: vec![
                LbaFormat {
                    lbads: 9,
                    ..LbaFormat::default()
                },
                LbaFormat {
                    lbads: 12,
                    ..LbaFormat::default()
                },
            ],
            ..IdentifyNamespace::default()
        };
        let b = ns.encode();
        assert_eq!((b[25], b[26]), (1, 1));
        assert_eq!(&b[132..136], &[0, 0, 12, 0]);
        let back = IdentifyNamespace::decode(&b).unwrap();
        assert_eq!(back.block_bytes(), Ok(4096));
        assert_eq!(back, ns);
    }

    #[test]
    fn lists() {
        let b = encode_nsid_list(&[3, 1, 2, 0]);
        assert_eq!(decode_nsid_list(&b).unwrap(), vec![1, 2, 3]);
        let d = [NsIdDescriptor::Nguid([9; 16]), NsIdDescriptor::Csi(0)];
        let b = NsIdDescriptor::encode_list(&d);
        assert_eq!(&b[..4], &[2, 16, 0, 0]);
        assert_eq!(NsIdDescriptor::decode_list(&b).unwrap(), d.to_vec());
    }
}
