//! Log pages: the Discovery log (LID 0x70, NVMe-oF 1.1 5.3), the Asymmetric Namespace Access
//! log (LID 0x0C, NVMe Base 2.0 5.16.1.12) and the SMART / Health Information log (LID
//! 0x02). The Reservation Report, also read-only host data, lives in
//! [`super::reservation`].

use super::bytes::{get_u128, get_u16, get_u32, get_u64, put_u128, put_u16, put_u32, put_u64};
use super::error::{invalid, need, WireError};
use super::text::{FixedAscii, Nqn};

/// Log page identifiers.
pub mod lid {
    /// Error Information.
    pub const ERROR: u8 = 0x01;
    /// SMART / Health Information.
    pub const SMART: u8 = 0x02;
    /// Firmware Slot Information.
    pub const FIRMWARE_SLOT: u8 = 0x03;
    /// Changed Namespace List.
    pub const CHANGED_NAMESPACES: u8 = 0x04;
    /// Commands Supported and Effects.
    pub const COMMAND_EFFECTS: u8 = 0x05;
    /// Asymmetric Namespace Access.
    pub const ANA: u8 = 0x0c;
    /// Discovery (discovery controllers only).
    pub const DISCOVERY: u8 = 0x70;
    /// Reservation Notification.
    pub const RESERVATION_NOTIFICATION: u8 = 0x80;
}

/// Size of the Discovery log header, and of each entry.
pub const DISCOVERY_RECORD_BYTES: usize = 1024;

/// Transport types (TRTYPE).
pub mod trtype {
    /// RDMA.
    pub const RDMA: u8 = 1;
    /// Fibre Channel.
    pub const FC: u8 = 2;
    /// TCP.
    pub const TCP: u8 = 3;
    /// Intra-host (loop).
    pub const LOOP: u8 = 254;
}

/// Address families (ADRFAM).
pub mod adrfam {
    /// IPv4.
    pub const IPV4: u8 = 1;
    /// IPv6.
    pub const IPV6: u8 = 2;
    /// InfiniBand.
    pub const IB: u8 = 3;
    /// Fibre Channel.
    pub const FC: u8 = 4;
    /// Intra-host.
    pub const LOOP: u8 = 254;
}

/// Subsystem types (SUBTYPE) of a Discovery log entry.
pub mod subtype {
    /// A referral to another discovery service.
    pub const REFERRAL: u8 = 1;
    /// An NVM subsystem.
    pub const NVM: u8 = 2;
    /// The discovery subsystem being queried.
    pub const CURRENT_DISCOVERY: u8 = 3;
}

/// TREQ values: bits 1:0 secure channel (0 unspecified, 1 required, 2 not required), bit 2
/// SQ flow control disable supported.
pub mod treq {
    /// Secure channel not required.
    pub const SECURE_CHANNEL_NOT_REQUIRED: u8 = 0b10;
    /// The subsystem lets the host disable SQ flow control.
    pub const SQ_FLOW_CONTROL_DISABLE: u8 = 1 << 2;
}

/// One Discovery log entry: how to reach one subsystem through one port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryEntry {
    /// Transport type (byte 0), see [`trtype`].
    pub trtype: u8,
    /// Address family (byte 1), see [`adrfam`].
    pub adrfam: u8,
    /// Subsystem type (byte 2), see [`subtype`].
    pub subtype: u8,
    /// Transport requirements (byte 3), see [`treq`].
    pub treq: u8,
    /// Port ID (bytes 5:4).
    pub portid: u16,
    /// Controller ID (bytes 7:6): 0xFFFF for the dynamic controller model.
    pub cntlid: u16,
    /// Admin max SQ size (bytes 9:8).
    pub asqsz: u16,
    /// Entry flags (bytes 11:10).
    pub eflags: u16,
    /// Transport service identifier (bytes 63:32): the TCP port as decimal text.
    pub trsvcid: FixedAscii<32>,
    /// Subsystem NQN (bytes 511:256).
    pub subnqn: Nqn,
    /// Transport address (bytes 767:512): the IP address as text.
    pub traddr: FixedAscii<256>,
    /// Transport specific address subtype (bytes 1023:768); for TCP byte 0 is SECTYPE
    /// (0 = no security).
    pub tsas: [u8; 256],
}

impl DiscoveryEntry {
    fn write(&self, b: &mut [u8]) {
        b[0] = self.trtype;
        b[1] = self.adrfam;
        b[2] = self.subtype;
        b[3] = self.treq;
        put_u16(b, 4, self.portid);
        put_u16(b, 6, self.cntlid);
        put_u16(b, 8, self.asqsz);
        put_u16(b, 10, self.eflags);
        self.trsvcid.write(&mut b[32..]);
        self.subnqn.write(&mut b[256..]);
        self.traddr.write(&mut b[512..]);
        b[768..1024].copy_from_slice(&self.tsas);
    }

    fn read(b: &[u8]) -> Result<Self, WireError> {
        const WHAT: &str = "Discovery log entry";
        Ok(DiscoveryEntry {
            trtype: b[0],
            adrfam: b[1],
            subtype: b[2],
            treq: b[3],
            portid: get_u16(b, 4),
            cntlid: get_u16(b, 6),
            asqsz: get_u16(b, 8),
            eflags: get_u16(b, 10),
            trsvcid: FixedAscii::decode_at(b, 32, WHAT, "TRSVCID")?,
            subnqn: Nqn::decode_at(b, 256, WHAT, "SUBNQN")?,
            traddr: FixedAscii::decode_at(b, 512, WHAT, "TRADDR")?,
            tsas: super::bytes::array(b, 768),
        })
    }
}

/// The Discovery log page.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DiscoveryLog {
    /// Generation counter (bytes 7:0): changes whenever the entries change, so a host that
    /// reads the page in pieces can tell it read one consistent version.
    pub genctr: u64,
    /// Record format (bytes 17:16), 0.
    pub recfmt: u16,
    /// The entries; NUMREC (bytes 15:8) is their count.
    pub entries: Vec<DiscoveryEntry>,
}

impl DiscoveryLog {
    /// Encodes the header and all entries.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; DISCOVERY_RECORD_BYTES * (1 + self.entries.len())];
        put_u64(&mut b, 0, self.genctr);
        put_u64(&mut b, 8, self.entries.len() as u64);
        put_u16(&mut b, 16, self.recfmt);
        let records = b[DISCOVERY_RECORD_BYTES..].chunks_exact_mut(DISCOVERY_RECORD_BYTES);
        for (entry, record) in self.entries.iter().zip(records) {
            entry.write(record);
        }
        b
    }

    /// Reads (GENCTR, NUMREC, RECFMT) from the header alone, which is what a host fetches
    /// first to learn how much to read.
    ///
    /// # Errors
    /// [`WireError::Short`] below 18 bytes.
    pub fn decode_header(data: &[u8]) -> Result<(u64, u64, u16), WireError> {
        need("Discovery log header", data, 18)?;
        Ok((get_u64(data, 0), get_u64(data, 8), get_u16(data, 16)))
    }

    /// Decodes the header and all NUMREC entries.
    ///
    /// # Errors
    /// [`WireError::Short`] when `data` does not hold NUMREC entries (checked before
    /// anything is allocated, so a huge NUMREC costs nothing), or an entry's field error.
    pub fn decode(data: &[u8]) -> Result<Self, WireError> {
        const WHAT: &str = "Discovery log page";
        need(WHAT, data, DISCOVERY_RECORD_BYTES)?;
        let (genctr, numrec, recfmt) = Self::decode_header(data)?;
        let available = (data.len() / DISCOVERY_RECORD_BYTES - 1) as u64;
        if numrec > available {
            let needed = usize::try_from(numrec.saturating_add(1))
                .unwrap_or(usize::MAX)
                .saturating_mul(DISCOVERY_RECORD_BYTES);
            return Err(WireError::Short {
                structure: WHAT,
                needed,
                len: data.len(),
            });
        }
        let entries = data[DISCOVERY_RECORD_BYTES..]
            .chunks_exact(DISCOVERY_RECORD_BYTES)
            .take(numrec as usize)
            .map(DiscoveryEntry::read)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(DiscoveryLog {
            genctr,
            recfmt,
            entries,
        })
    }
}

/// ANA states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum AnaState {
    /// Optimized: the preferred path.
    Optimized = 0x01,
    /// Non-optimized: works, but another path is better.
    NonOptimized = 0x02,
    /// Inaccessible: commands fail with Asymmetric Access Inaccessible for now.
    Inaccessible = 0x03,
    /// Persistent Loss: this path will not come back.
    PersistentLoss = 0x04,
    /// Change: the state is in transition.
    Change = 0x0f,
}

impl AnaState {
    /// The state for a raw value (byte 16 of a group descriptor, bits 3:0).
    #[must_use]
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0x01 => AnaState::Optimized,
            0x02 => AnaState::NonOptimized,
            0x03 => AnaState::Inaccessible,
            0x04 => AnaState::PersistentLoss,
            0x0f => AnaState::Change,
            _ => return None,
        })
    }
}

/// One ANA group descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnaGroup {
    /// ANA group ID (bytes 3:0).
    pub anagrpid: u32,
    /// Change count of this group (bytes 15:8).
    pub chgcnt: u64,
    /// State of the group through this controller (byte 16).
    pub state: AnaState,
    /// Namespaces in the group; NNSIDS (bytes 7:4) is their count. Empty when the host asked
    /// for groups only (RGO).
    pub nsids: Vec<u32>,
}

/// ANA log header size, and group descriptor header size.
const ANA_HEADER_BYTES: usize = 16;
const ANA_GROUP_HEADER_BYTES: usize = 32;

/// The Asymmetric Namespace Access log page.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AnaLog {
    /// Change count (bytes 7:0).
    pub chgcnt: u64,
    /// Groups; NGRPS (bytes 9:8) is their count (at most 65535 are encoded).
    pub groups: Vec<AnaGroup>,
}

impl AnaLog {
    /// Encodes the page.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let groups = &self.groups[..self.groups.len().min(usize::from(u16::MAX))];
        let mut b = vec![0u8; ANA_HEADER_BYTES];
        put_u64(&mut b, 0, self.chgcnt);
        put_u16(&mut b, 8, groups.len() as u16);
        for g in groups {
            let at = b.len();
            b.resize(at + ANA_GROUP_HEADER_BYTES + 4 * g.nsids.len(), 0);
            put_u32(&mut b, at, g.anagrpid);
            put_u32(&mut b, at + 4, g.nsids.len() as u32);
            put_u64(&mut b, at + 8, g.chgcnt);
            b[at + 16] = g.state as u8;
            for (i, nsid) in g.nsids.iter().enumerate() {
                put_u32(&mut b, at + ANA_GROUP_HEADER_BYTES + 4 * i, *nsid);
            }
        }
        b
    }

    /// Decodes the page; every count is checked against the bytes present before anything
    /// is allocated.
    ///
    /// # Errors
    /// [`WireError::Short`] when a group or its NSID list runs past the data,
    /// [`WireError::InvalidField`] for an unknown ANA state.
    pub fn decode(data: &[u8]) -> Result<Self, WireError> {
        const WHAT: &str = "ANA log page";
        need(WHAT, data, ANA_HEADER_BYTES)?;
        let ngrps = get_u16(data, 8);
        let mut groups = Vec::new();
        let mut at = ANA_HEADER_BYTES;
        for _ in 0..ngrps {
            need(WHAT, data, at + ANA_GROUP_HEADER_BYTES)?;
            let nnsids = get_u32(data, at + 4) as usize;
            let end = nnsids.checked_mul(4).and_then(|n| n.checked_add(at + 32));
            let end = end.unwrap_or(usize::MAX);
            need(WHAT, data, end)?;
            let raw_state = data[at + 16] & 0xf;
            let state = AnaState::from_u8(raw_state).ok_or_else(|| {
                invalid(
                    WHAT,
                    "ANA state",
                    at + 16,
                    u64::from(raw_state),
                    "1..=4 or 0xf",
                )
            })?;
            let nsids = data[at + ANA_GROUP_HEADER_BYTES..end]
                .chunks_exact(4)
                .map(|c| get_u32(c, 0))
                .collect();
            let (anagrpid, chgcnt) = (get_u32(data, at), get_u64(data, at + 8));
            groups.push(AnaGroup {
                anagrpid,
                chgcnt,
                state,
                nsids,
            });
            at = end;
        }
        Ok(AnaLog {
            chgcnt: get_u64(data, 0),
            groups,
        })
    }
}

/// Size of the SMART / Health Information log page.
pub const SMART_LOG_BYTES: usize = 512;

/// The SMART / Health Information log page (the commonly used fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SmartLog {
    /// Critical Warning bits (byte 0).
    pub critical_warning: u8,
    /// Composite Temperature in kelvin (bytes 2:1).
    pub temperature_kelvin: u16,
    /// Available Spare, percent (byte 3).
    pub available_spare: u8,
    /// Available Spare Threshold, percent (byte 4).
    pub available_spare_threshold: u8,
    /// Percentage Used (byte 5).
    pub percentage_used: u8,
    /// Data Units Read, in thousands of 512-byte units (bytes 47:32).
    pub data_units_read: u128,
    /// Data Units Written (bytes 63:48).
    pub data_units_written: u128,
    /// Host Read Commands (bytes 79:64).
    pub host_read_commands: u128,
    /// Host Write Commands (bytes 95:80).
    pub host_write_commands: u128,
    /// Controller Busy Time in minutes (bytes 111:96).
    pub controller_busy_time: u128,
    /// Power Cycles (bytes 127:112).
    pub power_cycles: u128,
    /// Power On Hours (bytes 143:128).
    pub power_on_hours: u128,
    /// Unsafe Shutdowns (bytes 159:144).
    pub unsafe_shutdowns: u128,
    /// Media and Data Integrity Errors (bytes 175:160).
    pub media_errors: u128,
    /// Number of Error Information Log Entries (bytes 191:176).
    pub error_log_entries: u128,
}

impl SmartLog {
    const COUNTERS_AT: usize = 32;

    fn counters(&self) -> [u128; 10] {
        [
            self.data_units_read,
            self.data_units_written,
            self.host_read_commands,
            self.host_write_commands,
            self.controller_busy_time,
            self.power_cycles,
            self.power_on_hours,
            self.unsafe_shutdowns,
            self.media_errors,
            self.error_log_entries,
        ]
    }

    /// Encodes to 512 bytes.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; SMART_LOG_BYTES];
        b[0] = self.critical_warning;
        put_u16(&mut b, 1, self.temperature_kelvin);
        b[3] = self.available_spare;
        b[4] = self.available_spare_threshold;
        b[5] = self.percentage_used;
        for (i, v) in self.counters().iter().enumerate() {
            put_u128(&mut b, Self::COUNTERS_AT + 16 * i, *v);
        }
        b
    }

    /// Decodes the first 512 bytes of `data`.
    ///
    /// # Errors
    /// [`WireError::Short`] below 512 bytes.
    pub fn decode(data: &[u8]) -> Result<Self, WireError> {
        need("SMART / Health log", data, SMART_LOG_BYTES)?;
        let c = |i: usize| get_u128(data, Self::COUNTERS_AT + 16 * i);
        Ok(SmartLog {
            critical_warning: data[0],
            temperature_kelvin: get_u16(data, 1),
            available_spare: data[3],
            available_spare_threshold: data[4],
            percentage_used: data[5],
            data_units_read: c(0),
            data_units_written: c(1),
            host_read_commands: c(2),
            host_write_commands: c(3),
            controller_busy_time: c(4),
            power_cycles: c(5),
            power_on_hours: c(6),
            unsafe_shutdowns: c(7),
            media_errors: c(8),
            error_log_entries: c(9),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> DiscoveryEntry {
        DiscoveryEntry {
            trtype: trtype::TCP,
            adrfam: adrfam::IPV4,
            subtype: subtype::NVM,
            treq: treq::SECURE_CHANNEL_NOT_REQUIRED,
            portid: 1,
            cntlid: 0xffff,
            asqsz: 32,
            eflags: 0,
            trsvcid: FixedAscii::new("4420").unwrap(),
            subnqn: Nqn::new("nqn.2024-01.io.tessera:d0").unwrap(),
            traddr: FixedAscii::new("192.0.2.1").unwrap(),
            tsas: [0; 256],
        }
    }

    #[test]
    fn discovery_layout() {
        let log = DiscoveryLog {
            genctr: 9,
            recfmt: 0,
            entries: vec![entry(), entry()],
        };
        let b = log.encode();
        assert_eq!(b.len(), 3072);
        assert_eq!(&b[8..16], &[2, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&b[1024..1034], &[3, 1, 2, 2, 1, 0, 0xff, 0xff, 32, 0]);
        assert_eq!(&b[1024 + 32..1024 + 37], b"4420 ");
        assert_eq!(&b[1024 + 512..1024 + 521], b"192.0.2.1");
        assert_eq!(DiscoveryLog::decode(&b).unwrap(), log);
        assert!(matches!(
            DiscoveryLog::decode(&b[..2048]),
            Err(WireError::Short { .. })
        ));
    }

    #[test]
    fn ana_layout_and_bounds() {
        let log = AnaLog {
            chgcnt: 3,
            groups: vec![AnaGroup {
                anagrpid: 1,
                chgcnt: 2,
                state: AnaState::Optimized,
                nsids: vec![1, 2],
            }],
        };
        let b = log.encode();
        assert_eq!(b.len(), 16 + 32 + 8);
        assert_eq!(&b[16..24], &[1, 0, 0, 0, 2, 0, 0, 0]);
        assert_eq!(b[32], 1);
        assert_eq!(AnaLog::decode(&b).unwrap(), log);
        let mut huge = b.clone();
        huge[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            AnaLog::decode(&huge),
            Err(WireError::Short { .. })
        ));
    }

    #[test]
    fn smart_round_trip() {
        let s = SmartLog {
            temperature_kelvin: 300,
            power_cycles: 7,
            ..SmartLog::default()
        };
        let b = s.encode();
        assert_eq!(&b[1..3], &[0x2c, 0x01]);
        assert_eq!(b[112], 7);
        assert_eq!(SmartLog::decode(&b).unwrap(), s);
    }
}
