//! GPFS-style stanza files, as given to `tessera nsd create -F` and `tessera fs create -F`.
//!
//! ```text
//! # comment to the end of the line
//! %nsd: device=nvme0n1 nsd=de0704a01v1 usage=dataAndMetadata
//! failureGroup=704 pool=system thinDiskType=no
//! %nsd:
//!   device=/dev/dm-3
//!   nsd=d2 usage=dataOnly failureGroup=1 pool=data
//! %pool: pool=data blockSize=4M layoutMap=cluster
//! ```
//!
//! A stanza starts with a `%kind:` header line; its `key=value` attributes follow on the same
//! line and on any following line that does not start with `%`. Attributes are separated by
//! whitespace; values cannot contain whitespace or `#`. Keys and kinds are case-sensitive
//! as in GPFS; enumerated values (`usage`, `thinDiskType`, ...) ignore case.
//!
//! Parsing is in two steps: [`parse_stanzas`] checks only the syntax and keeps every stanza;
//! [`parse_nsd_stanzas`] and [`parse_pool_stanzas`] check the attributes of one kind and skip
//! the other known kinds, so one file can feed both `nsd create` and `fs create`. Every
//! error names the line, the attribute, what is wrong and what is accepted.

use std::collections::hash_map::{Entry, HashMap};

use crate::types::{check_name, ParseValueError, NAME_RULE};
use crate::{DiskUsage, ThinDiskType};

/// The most attributes one stanza may have. The longest real stanzas have about ten; the
/// limit keeps a runaway file (a missing `%` header) from building huge stanzas.
pub const MAX_ATTRS_PER_STANZA: usize = 64;

/// The stanza kinds Tessera knows. The typed parsers skip known kinds that are not theirs,
/// and refuse unknown ones, so that a typo such as `%nds:` is an error rather than a disk
/// silently left out.
pub const KNOWN_STANZA_KINDS: [&str; 6] = ["nsd", "pool", "pdisk", "vdisk", "da", "rg"];

/// The attributes of a `%nsd:` stanza.
pub const NSD_KEYS: [&str; 7] = [
    "device",
    "nsd",
    "usage",
    "failureGroup",
    "pool",
    "thinDiskType",
    "servers",
];

/// The attributes of a `%pool:` stanza.
pub const POOL_KEYS: [&str; 7] = [
    "pool",
    "blockSize",
    "usage",
    "layoutMap",
    "allowWriteAffinity",
    "writeAffinityDepth",
    "blockGroupFactor",
];

/// The attributes of a `%pdisk:` stanza (`tessera da create -F`).
pub const PDISK_KEYS: [&str; 4] = ["pdisk", "device", "enclosure", "slot"];

/// The highest slot number an enclosure may have; real enclosures have 12 to 106 slots.
pub const SLOT_MAX: u32 = 4096;

/// The most NSD servers one NSD may list, as in GPFS: beyond a few, more servers add
/// failover candidates nobody will ever reach.
pub const MAX_SERVERS: usize = 8;

/// Failure groups GPFS accepts: -1 means "shares no point of failure with any other disk".
pub const FAILURE_GROUP_MIN: i32 = -1;
pub const FAILURE_GROUP_MAX: i32 = 4000;

/// The longest device path accepted (Linux PATH_MAX less the terminating NUL).
pub const DEVICE_MAX_BYTES: usize = 4095;

/// One `key=value` attribute and the line it was on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attr {
    pub key: String,
    pub value: String,
    pub line: usize,
}

/// One stanza: its kind (`nsd` for `%nsd:`), the line of its header and its attributes in
/// file order. Keys are unique within a stanza.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stanza {
    pub kind: String,
    pub line: usize,
    pub attrs: Vec<Attr>,
}

impl Stanza {
    /// The attribute named `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Attr> {
        self.attrs.iter().find(|a| a.key == key)
    }
}

/// A `%nsd:` stanza with GPFS defaults applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NsdStanza {
    /// The block device as written: a path (`/dev/dm-3`) or a name under /dev (`nvme0n1`).
    pub device: String,
    /// The NSD name; `None` lets `nsd create` generate one.
    pub nsd: Option<String>,
    /// Default `dataAndMetadata`.
    pub usage: DiskUsage,
    /// Default -1 (no failure group in common with any other disk).
    pub failure_group: i32,
    /// Default `system`.
    pub pool: String,
    /// Default `no`.
    pub thin_disk_type: ThinDiskType,
    /// NSD servers in preference order; empty means every node reaches the device directly.
    pub servers: Vec<String>,
    /// Line of the `%nsd:` header.
    pub line: usize,
}

/// A `%pdisk:` stanza: one drive of a declustered array and where it sits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PdiskStanza {
    /// The pdisk name; default `<enclosure>s<slot>` (such as `e1s03`).
    pub pdisk: String,
    /// A path (`/dev/nvme3n1`, a file) or a name under /dev.
    pub device: String,
    /// The enclosure (JBOF, drive server, shelf) holding the drive: placement keeps the
    /// strips of a stripe in distinct enclosures, so it must name the real failure domain.
    pub enclosure: String,
    /// The slot in the enclosure, from 1. Default: the next free slot of that enclosure in
    /// file order.
    pub slot: u32,
    /// Line of the `%pdisk:` header.
    pub line: usize,
}

/// How a pool places consecutive blocks of a file (`layoutMap=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LayoutMap {
    Scatter,
    Cluster,
}

impl LayoutMap {
    pub fn as_str(&self) -> &'static str {
        match self {
            LayoutMap::Scatter => "scatter",
            LayoutMap::Cluster => "cluster",
        }
    }
}

/// A `%pool:` stanza. Attributes left out are `None`: their defaults belong to the file
/// system being created (its `-B` block size, for instance), not to the stanza.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolStanza {
    pub pool: String,
    /// As written (`4M`); [`PoolStanza::block_size_bytes`] gives the value.
    pub block_size: Option<String>,
    pub usage: Option<DiskUsage>,
    pub layout_map: Option<LayoutMap>,
    pub allow_write_affinity: Option<bool>,
    pub write_affinity_depth: Option<u32>,
    pub block_group_factor: Option<u32>,
    /// Line of the `%pool:` header.
    pub line: usize,
}

impl PoolStanza {
    /// The block size in bytes, if the stanza gives one (it was validated when parsed).
    pub fn block_size_bytes(&self) -> Option<u64> {
        let text = self.block_size.as_deref()?;
        Some(parse_block_size(text).expect("block size validated when parsed"))
    }
}

/// What is wrong with a stanza file. Every message starts with `line N:`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StanzaError {
    #[error("line {line}: `{text}`: malformed stanza header; write `%kind:` such as `%nsd:`")]
    BadHeader { line: usize, text: String },
    #[error(
        "line {line}: `{token}`: attribute before any stanza header; \
         start the stanza with a header line such as `%nsd:`"
    )]
    OutsideStanza { line: usize, token: String },
    #[error(
        "line {line}: `{token}`: attribute without `=`; \
         write attributes as key=value with no spaces around `=`"
    )]
    MissingEquals { line: usize, token: String },
    #[error("line {line}: `{token}`: attribute without a key; write attributes as key=value")]
    EmptyKey { line: usize, token: String },
    #[error(
        "line {line}: {key}=: empty value; \
         put the value right after `=`, or leave the attribute out to take its default"
    )]
    EmptyValue { line: usize, key: String },
    #[error(
        "line {line}: {key}: given twice in one stanza (first on line {first_line}); keep one"
    )]
    DuplicateKey {
        line: usize,
        key: String,
        first_line: usize,
    },
    #[error(
        "line {line}: %{kind}: stanza has more than {max} attributes; \
         is a `%{kind}:` header missing?"
    )]
    TooManyAttrs {
        line: usize,
        kind: String,
        max: usize,
    },
    #[error("line {line}: %{kind}: unknown stanza kind; use one of {accepted}")]
    UnknownKind {
        line: usize,
        kind: String,
        accepted: String,
    },
    #[error(
        "line {line}: {key}: unknown attribute of a %{kind} stanza \
         (keys are case-sensitive); use one of {accepted}"
    )]
    UnknownKey {
        line: usize,
        kind: String,
        key: String,
        accepted: String,
    },
    #[error("line {line}: %{kind} stanza without {key}=; add {key}={example}")]
    MissingKey {
        line: usize,
        kind: String,
        key: String,
        example: String,
    },
    #[error("line {line}: {key}={value}: {problem}; {accepted}")]
    InvalidValue {
        line: usize,
        key: String,
        value: String,
        problem: String,
        accepted: String,
    },
    #[error(
        "line {line}: nsd={name}: NSD name already used on line {first_line}; \
         give every NSD its own name"
    )]
    DuplicateNsd {
        line: usize,
        name: String,
        first_line: usize,
    },
    #[error(
        "line {line}: device={device}: device already used on line {first_line}; \
         list every device once"
    )]
    DuplicateDevice {
        line: usize,
        device: String,
        first_line: usize,
    },
    #[error(
        "line {line}: pdisk={name}: pdisk name already used on line {first_line}; \
         give every pdisk its own name"
    )]
    DuplicatePdisk {
        line: usize,
        name: String,
        first_line: usize,
    },
    #[error(
        "line {line}: enclosure={enclosure} slot={slot}: slot already taken on line \
         {first_line}; give every drive of an enclosure its own slot"
    )]
    DuplicateSlot {
        line: usize,
        enclosure: String,
        slot: u32,
        first_line: usize,
    },
    #[error(
        "line {line}: pool={pool}: pool already described on line {first_line}; \
         merge the two %pool stanzas"
    )]
    DuplicatePool {
        line: usize,
        pool: String,
        first_line: usize,
    },
}

impl StanzaError {
    /// The 1-based line the error is about.
    pub fn line(&self) -> usize {
        use StanzaError::*;
        match self {
            BadHeader { line, .. }
            | OutsideStanza { line, .. }
            | MissingEquals { line, .. }
            | EmptyKey { line, .. }
            | EmptyValue { line, .. }
            | DuplicateKey { line, .. }
            | TooManyAttrs { line, .. }
            | UnknownKind { line, .. }
            | UnknownKey { line, .. }
            | MissingKey { line, .. }
            | InvalidValue { line, .. }
            | DuplicateNsd { line, .. }
            | DuplicateDevice { line, .. }
            | DuplicatePool { line, .. }
            | DuplicatePdisk { line, .. }
            | DuplicateSlot { line, .. } => *line,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Syntax.

/// Splits `text` into stanzas, checking only the syntax (see the module documentation).
pub fn parse_stanzas(text: &str) -> Result<Vec<Stanza>, StanzaError> {
    let mut stanzas: Vec<Stanza> = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        // A comment runs to the end of the line, so values can never contain `#`.
        let content = raw.split('#').next().unwrap_or("").trim();
        let attrs_text = match content.strip_prefix('%') {
            Some(header) => {
                let (kind, rest) = parse_header(header, line)?;
                stanzas.push(Stanza {
                    kind,
                    line,
                    attrs: Vec::new(),
                });
                rest
            }
            None => content,
        };
        for token in attrs_text.split_whitespace() {
            let Some(stanza) = stanzas.last_mut() else {
                return Err(StanzaError::OutsideStanza {
                    line,
                    token: token.to_string(),
                });
            };
            add_attr(stanza, parse_attr(token, line)?)?;
        }
    }
    Ok(stanzas)
}

/// Parses the text after `%` of a header line into the kind and the rest of the line.
fn parse_header(header: &str, line: usize) -> Result<(String, &str), StanzaError> {
    let bad = || StanzaError::BadHeader {
        line,
        text: format!("%{header}"),
    };
    let (kind, rest) = header.split_once(':').ok_or_else(bad)?;
    if kind.is_empty() || !kind.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(bad());
    }
    Ok((kind.to_string(), rest))
}

fn parse_attr(token: &str, line: usize) -> Result<Attr, StanzaError> {
    let (key, value) = token
        .split_once('=')
        .ok_or_else(|| StanzaError::MissingEquals {
            line,
            token: token.to_string(),
        })?;
    if key.is_empty() {
        return Err(StanzaError::EmptyKey {
            line,
            token: token.to_string(),
        });
    }
    if value.is_empty() {
        return Err(StanzaError::EmptyValue {
            line,
            key: key.to_string(),
        });
    }
    Ok(Attr {
        key: key.to_string(),
        value: value.to_string(),
        line,
    })
}

fn add_attr(stanza: &mut Stanza, attr: Attr) -> Result<(), StanzaError> {
    if let Some(first) = stanza.get(&attr.key) {
        return Err(StanzaError::DuplicateKey {
            line: attr.line,
            key: attr.key,
            first_line: first.line,
        });
    }
    if stanza.attrs.len() == MAX_ATTRS_PER_STANZA {
        let kind = stanza.kind.clone();
        return Err(StanzaError::TooManyAttrs {
            line: attr.line,
            kind,
            max: MAX_ATTRS_PER_STANZA,
        });
    }
    stanza.attrs.push(attr);
    assert!(stanza.attrs.len() <= MAX_ATTRS_PER_STANZA);
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Values. Each parser returns what is wrong and what is accepted, and `field` adds the
// line, key and value to make the error.

/// Why a value was refused: what is wrong and what would be accepted.
struct Invalid {
    problem: String,
    accepted: String,
}

impl Invalid {
    fn new(problem: impl Into<String>, accepted: impl Into<String>) -> Invalid {
        Invalid {
            problem: problem.into(),
            accepted: accepted.into(),
        }
    }
}

impl From<ParseValueError> for Invalid {
    fn from(e: ParseValueError) -> Invalid {
        Invalid::new(
            format!("unknown {}", e.what),
            format!("use one of {}", e.accepted),
        )
    }
}

/// Parses attribute `key` of `stanza` with `parse`, or `None` when it is absent.
fn field<T>(
    stanza: &Stanza,
    key: &str,
    parse: impl Fn(&str) -> Result<T, Invalid>,
) -> Result<Option<T>, StanzaError> {
    let Some(attr) = stanza.get(key) else {
        return Ok(None);
    };
    let value = parse(&attr.value).map_err(|invalid| StanzaError::InvalidValue {
        line: attr.line,
        key: attr.key.clone(),
        value: attr.value.clone(),
        problem: invalid.problem,
        accepted: invalid.accepted,
    })?;
    Ok(Some(value))
}

fn parse_name(text: &str, what: &str) -> Result<String, Invalid> {
    check_name(text)
        .map_err(|problem| Invalid::new(format!("invalid {what}: {problem}"), NAME_RULE))?;
    Ok(text.to_string())
}

fn parse_device(text: &str) -> Result<String, Invalid> {
    let accepted = "use a device path such as /dev/nvme0n1, or a name under /dev such as nvme0n1";
    if text.len() > DEVICE_MAX_BYTES {
        return Err(Invalid::new(
            format!("device longer than {DEVICE_MAX_BYTES} bytes"),
            accepted,
        ));
    }
    if text.chars().any(|c| c.is_control() || c == '=') {
        return Err(Invalid::new(
            "device contains a control character or `=`",
            accepted,
        ));
    }
    Ok(text.to_string())
}

fn parse_failure_group(text: &str) -> Result<i32, Invalid> {
    let accepted = format!(
        "use an integer from {FAILURE_GROUP_MIN} (no failure group) to {FAILURE_GROUP_MAX}"
    );
    let group: i32 = text
        .parse()
        .map_err(|_| Invalid::new("not an integer", &accepted))?;
    if !(FAILURE_GROUP_MIN..=FAILURE_GROUP_MAX).contains(&group) {
        return Err(Invalid::new("failure group out of range", accepted));
    }
    Ok(group)
}

fn parse_servers(text: &str) -> Result<Vec<String>, Invalid> {
    let accepted = format!(
        "list 1 to {MAX_SERVERS} distinct node names or addresses separated by commas, \
         without spaces, such as servers=node1,node2"
    );
    let host_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':');
    let mut servers: Vec<String> = Vec::new();
    for server in text.split(',') {
        if server.is_empty() || !server.chars().all(host_char) {
            return Err(Invalid::new(
                format!("invalid server name `{server}`"),
                &accepted,
            ));
        }
        if servers.iter().any(|s| s == server) {
            return Err(Invalid::new(
                format!("server `{server}` listed twice"),
                &accepted,
            ));
        }
        if servers.len() == MAX_SERVERS {
            return Err(Invalid::new(
                format!("more than {MAX_SERVERS} servers"),
                &accepted,
            ));
        }
        servers.push(server.to_string());
    }
    assert!(!servers.is_empty() && servers.len() <= MAX_SERVERS);
    Ok(servers)
}

/// The smallest and largest block sizes a pool may have. 16 MiB is the GPFS maximum; 4 KiB
/// (one sector) is below the GPFS minimum of 64 KiB, allowed so tests can use tiny file
/// systems.
pub const BLOCK_SIZE_MIN_BYTES: u64 = 4096;
pub const BLOCK_SIZE_MAX_BYTES: u64 = 16 << 20;

/// Parses a block size such as `4M`, `256K`, `256k` or `65536` into bytes.
pub fn parse_block_size(text: &str) -> Result<u64, String> {
    let (digits, unit) = match text.char_indices().last() {
        Some((at, 'k' | 'K')) => (&text[..at], 1u64 << 10),
        Some((at, 'm' | 'M')) => (&text[..at], 1u64 << 20),
        _ => (text, 1),
    };
    let number: u64 = digits.parse().map_err(|_| "not a size".to_string())?;
    let bytes = number.checked_mul(unit).ok_or("size too large")?;
    let in_range = (BLOCK_SIZE_MIN_BYTES..=BLOCK_SIZE_MAX_BYTES).contains(&bytes);
    if !bytes.is_power_of_two() || !in_range {
        return Err("block size must be a power of two from 4K to 16M".to_string());
    }
    Ok(bytes)
}

fn parse_pool_usage(text: &str) -> Result<DiskUsage, Invalid> {
    let usage: DiskUsage = text.parse()?;
    if usage == DiskUsage::DescOnly {
        let accepted = "use one of dataAndMetadata, dataOnly, metadataOnly";
        return Err(Invalid::new(
            "descOnly applies to disks, not pools",
            accepted,
        ));
    }
    Ok(usage)
}

fn parse_layout_map(text: &str) -> Result<LayoutMap, Invalid> {
    [LayoutMap::Scatter, LayoutMap::Cluster]
        .into_iter()
        .find(|m| m.as_str().eq_ignore_ascii_case(text))
        .ok_or_else(|| Invalid::new("unknown layoutMap", "use one of scatter, cluster"))
}

fn parse_yes_no(text: &str) -> Result<bool, Invalid> {
    match text.to_ascii_lowercase().as_str() {
        "yes" => Ok(true),
        "no" => Ok(false),
        _ => Err(Invalid::new("not yes or no", "use yes or no")),
    }
}

fn parse_u32_in(text: &str, min: u32, max: u32) -> Result<u32, Invalid> {
    let accepted = format!("use an integer from {min} to {max}");
    match text.parse::<u32>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        Ok(_) => Err(Invalid::new("out of range", accepted)),
        Err(_) => Err(Invalid::new("not an integer", accepted)),
    }
}

// ---------------------------------------------------------------------------------------
// Typed stanzas.

/// Refuses stanza kinds Tessera does not know (see [`KNOWN_STANZA_KINDS`]).
fn check_kinds(stanzas: &[Stanza]) -> Result<(), StanzaError> {
    for s in stanzas {
        if !KNOWN_STANZA_KINDS.contains(&s.kind.as_str()) {
            let accepted = KNOWN_STANZA_KINDS.map(|k| format!("%{k}")).join(", ");
            return Err(StanzaError::UnknownKind {
                line: s.line,
                kind: s.kind.clone(),
                accepted,
            });
        }
    }
    Ok(())
}

fn check_keys(stanza: &Stanza, keys: &[&str]) -> Result<(), StanzaError> {
    match stanza
        .attrs
        .iter()
        .find(|a| !keys.contains(&a.key.as_str()))
    {
        None => Ok(()),
        Some(attr) => Err(StanzaError::UnknownKey {
            line: attr.line,
            kind: stanza.kind.clone(),
            key: attr.key.clone(),
            accepted: keys.join(", "),
        }),
    }
}

fn required<T>(
    stanza: &Stanza,
    key: &str,
    example: &str,
    value: Option<T>,
) -> Result<T, StanzaError> {
    value.ok_or_else(|| StanzaError::MissingKey {
        line: stanza.line,
        kind: stanza.kind.clone(),
        key: key.to_string(),
        example: example.to_string(),
    })
}

fn nsd_from_stanza(s: &Stanza) -> Result<NsdStanza, StanzaError> {
    assert_eq!(s.kind, "nsd");
    check_keys(s, &NSD_KEYS)?;
    let device = required(
        s,
        "device",
        "/dev/nvme0n1",
        field(s, "device", parse_device)?,
    )?;
    let nsd = field(s, "nsd", |v| parse_name(v, "NSD name"))?;
    let usage = field(s, "usage", |v| Ok(v.parse::<DiskUsage>()?))?;
    let failure_group = field(s, "failureGroup", parse_failure_group)?;
    let pool = field(s, "pool", |v| parse_name(v, "pool name"))?;
    let thin_disk_type = field(s, "thinDiskType", |v| Ok(v.parse::<ThinDiskType>()?))?;
    let servers = field(s, "servers", parse_servers)?;
    Ok(NsdStanza {
        device,
        nsd,
        usage: usage.unwrap_or(DiskUsage::DataAndMetadata),
        failure_group: failure_group.unwrap_or(-1),
        pool: pool.unwrap_or_else(|| "system".to_string()),
        thin_disk_type: thin_disk_type.unwrap_or(ThinDiskType::No),
        servers: servers.unwrap_or_default(),
        line: s.line,
    })
}

/// Records that `key` is used on `line`; returns the line of an earlier use, if any.
fn claim(seen: &mut HashMap<String, usize>, key: &str, line: usize) -> Result<(), usize> {
    match seen.entry(key.to_string()) {
        Entry::Occupied(first) => Err(*first.get()),
        Entry::Vacant(slot) => {
            slot.insert(line);
            Ok(())
        }
    }
}

/// The device as the kernel names it: `nvme0n1` and `/dev/nvme0n1` are the same device.
fn device_identity(device: &str) -> &str {
    device.strip_prefix("/dev/").unwrap_or(device)
}

/// Parses the `%nsd:` stanzas of `text`, applying GPFS defaults, and checks that no NSD
/// name and no device appears twice. Other known stanza kinds are skipped.
pub fn parse_nsd_stanzas(text: &str) -> Result<Vec<NsdStanza>, StanzaError> {
    let stanzas = parse_stanzas(text)?;
    check_kinds(&stanzas)?;
    let mut names = HashMap::new();
    let mut devices = HashMap::new();
    let mut nsds = Vec::new();
    for s in stanzas.iter().filter(|s| s.kind == "nsd") {
        let nsd = nsd_from_stanza(s)?;
        if let Some(name) = &nsd.nsd {
            let line = s.get("nsd").expect("nsd attribute").line;
            claim(&mut names, name, line).map_err(|first_line| StanzaError::DuplicateNsd {
                line,
                name: name.clone(),
                first_line,
            })?;
        }
        let line = s.get("device").expect("device attribute").line;
        claim(&mut devices, device_identity(&nsd.device), line).map_err(|first_line| {
            StanzaError::DuplicateDevice {
                line,
                device: nsd.device.clone(),
                first_line,
            }
        })?;
        nsds.push(nsd);
    }
    Ok(nsds)
}

/// One `%nsd` stanza of `nsd change -F` [mmchnsd]: which NSD, and its new server list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NsdServersChange {
    pub nsd: String,
    /// The new list, in preference order.
    pub servers: Vec<String>,
    pub line: usize,
}

/// Parses the stanzas of `nsd change -F`: each names an NSD (`nsd=`) and its new server
/// list (`servers=`); other attributes of an NSD are not changed this way and are refused,
/// so a stanza file written for `nsd create` is not mistaken for one.
pub fn parse_nsd_servers_changes(text: &str) -> Result<Vec<NsdServersChange>, StanzaError> {
    let stanzas = parse_stanzas(text)?;
    let mut names = HashMap::new();
    let mut changes = Vec::new();
    for s in &stanzas {
        if s.kind != "nsd" {
            return Err(StanzaError::InvalidValue {
                line: s.line,
                key: "%".to_string() + &s.kind,
                value: String::new(),
                problem: "only %nsd stanzas change NSD servers".into(),
                accepted: "%nsd: nsd=NAME servers=NODE[,NODE...]".into(),
            });
        }
        check_keys(s, &["nsd", "servers"])?;
        let nsd = required(
            s,
            "nsd",
            "nsd1",
            field(s, "nsd", |v| parse_name(v, "NSD name"))?,
        )?;
        let servers = required(
            s,
            "servers",
            "node1,node2",
            field(s, "servers", parse_servers)?,
        )?;
        let line = s.get("nsd").expect("nsd attribute").line;
        claim(&mut names, &nsd, line).map_err(|first_line| StanzaError::DuplicateNsd {
            line,
            name: nsd.clone(),
            first_line,
        })?;
        changes.push(NsdServersChange {
            nsd,
            servers,
            line: s.line,
        });
    }
    Ok(changes)
}

fn pool_from_stanza(s: &Stanza) -> Result<PoolStanza, StanzaError> {
    assert_eq!(s.kind, "pool");
    check_keys(s, &POOL_KEYS)?;
    let pool = field(s, "pool", |v| parse_name(v, "pool name"))?;
    let block_size = field(s, "blockSize", |v| {
        parse_block_size(v)
            .map_err(|problem| Invalid::new(problem, "use a size such as 256K or 4M"))?;
        Ok(v.to_string())
    })?;
    Ok(PoolStanza {
        pool: required(s, "pool", "data", pool)?,
        block_size,
        usage: field(s, "usage", parse_pool_usage)?,
        layout_map: field(s, "layoutMap", parse_layout_map)?,
        allow_write_affinity: field(s, "allowWriteAffinity", parse_yes_no)?,
        write_affinity_depth: field(s, "writeAffinityDepth", |v| parse_u32_in(v, 0, 2))?,
        block_group_factor: field(s, "blockGroupFactor", |v| parse_u32_in(v, 1, 1024))?,
        line: s.line,
    })
}

/// Parses the `%pool:` stanzas of `text` and checks that no pool is described twice.
/// Other known stanza kinds are skipped.
pub fn parse_pool_stanzas(text: &str) -> Result<Vec<PoolStanza>, StanzaError> {
    let stanzas = parse_stanzas(text)?;
    check_kinds(&stanzas)?;
    let mut seen = HashMap::new();
    let mut pools = Vec::new();
    for s in stanzas.iter().filter(|s| s.kind == "pool") {
        let pool = pool_from_stanza(s)?;
        let line = s.get("pool").expect("pool attribute").line;
        claim(&mut seen, &pool.pool, line).map_err(|first_line| StanzaError::DuplicatePool {
            line,
            pool: pool.pool.clone(),
            first_line,
        })?;
        pools.push(pool);
    }
    Ok(pools)
}

/// Parses the `%pdisk:` stanzas of `text` and checks that no pdisk name, device or
/// enclosure slot appears twice. Other known stanza kinds are skipped.
pub fn parse_pdisk_stanzas(text: &str) -> Result<Vec<PdiskStanza>, StanzaError> {
    let stanzas = parse_stanzas(text)?;
    check_kinds(&stanzas)?;
    let mut names = HashMap::new();
    let mut devices = HashMap::new();
    let mut slots: HashMap<(String, u32), usize> = HashMap::new();
    let mut pdisks = Vec::new();
    for s in stanzas.iter().filter(|s| s.kind == "pdisk") {
        check_keys(s, &PDISK_KEYS)?;
        let device = required(
            s,
            "device",
            "/dev/nvme0n1",
            field(s, "device", parse_device)?,
        )?;
        let enclosure = required(
            s,
            "enclosure",
            "jbof1",
            field(s, "enclosure", |v| parse_name(v, "enclosure name"))?,
        )?;
        let slot = match field(s, "slot", |v| parse_u32_in(v, 1, SLOT_MAX))? {
            Some(slot) => slot,
            // The next slot of this enclosure not taken by an earlier stanza.
            None => (1..=SLOT_MAX)
                .find(|n| !slots.contains_key(&(enclosure.clone(), *n)))
                .ok_or_else(|| StanzaError::InvalidValue {
                    line: s.line,
                    key: "slot".to_string(),
                    value: String::new(),
                    problem: format!("enclosure {enclosure} has no free slot"),
                    accepted: format!("use at most {SLOT_MAX} drives per enclosure"),
                })?,
        };
        let slot_line = s.get("slot").map_or(s.line, |a| a.line);
        if let Some(first_line) = slots.insert((enclosure.clone(), slot), slot_line) {
            return Err(StanzaError::DuplicateSlot {
                line: slot_line,
                enclosure,
                slot,
                first_line,
            });
        }
        let pdisk = match field(s, "pdisk", |v| parse_name(v, "pdisk name"))? {
            Some(name) => name,
            None => format!("{enclosure}s{slot:02}"),
        };
        let name_line = s.get("pdisk").map_or(s.line, |a| a.line);
        claim(&mut names, &pdisk, name_line).map_err(|first_line| StanzaError::DuplicatePdisk {
            line: name_line,
            name: pdisk.clone(),
            first_line,
        })?;
        let line = s.get("device").expect("device attribute").line;
        claim(&mut devices, device_identity(&device), line).map_err(|first_line| {
            StanzaError::DuplicateDevice {
                line,
                device: device.clone(),
                first_line,
            }
        })?;
        pdisks.push(PdiskStanza {
            pdisk,
            device,
            enclosure,
            slot,
            line: s.line,
        });
    }
    Ok(pdisks)
}

// ---------------------------------------------------------------------------------------
// Formatting.

/// Writes `nsd` back as a stanza, one attribute per line, every attribute explicit, the way
/// `nsd create` rewrites the stanza file so it can be fed to `fs create` unchanged.
pub fn format_nsd_stanza(nsd: &NsdStanza) -> String {
    let mut out = format!("%nsd:\n  device={}\n", nsd.device);
    if let Some(name) = &nsd.nsd {
        out += &format!("  nsd={name}\n");
    }
    out += &format!("  usage={}\n", nsd.usage);
    out += &format!("  failureGroup={}\n", nsd.failure_group);
    out += &format!("  pool={}\n", nsd.pool);
    out += &format!("  thinDiskType={}\n", nsd.thin_disk_type);
    if !nsd.servers.is_empty() {
        out += &format!("  servers={}\n", nsd.servers.join(","));
    }
    out
}

/// Writes `pool` back as a stanza, with only the attributes it has.
pub fn format_pool_stanza(pool: &PoolStanza) -> String {
    let mut out = format!("%pool:\n  pool={}\n", pool.pool);
    let mut add = |key: &str, value: Option<String>| {
        if let Some(value) = value {
            out += &format!("  {key}={value}\n");
        }
    };
    add("blockSize", pool.block_size.clone());
    add("usage", pool.usage.map(|u| u.to_string()));
    add("layoutMap", pool.layout_map.map(|m| m.as_str().to_string()));
    let yes_no = |b: bool| if b { "yes" } else { "no" }.to_string();
    add("allowWriteAffinity", pool.allow_write_affinity.map(yes_no));
    add(
        "writeAffinityDepth",
        pool.write_affinity_depth.map(|n| n.to_string()),
    );
    add(
        "blockGroupFactor",
        pool.block_group_factor.map(|n| n.to_string()),
    );
    out
}

/// Writes `pdisk` back as a stanza with every attribute explicit.
pub fn format_pdisk_stanza(pdisk: &PdiskStanza) -> String {
    format!(
        "%pdisk:\n  pdisk={}\n  device={}\n  enclosure={}\n  slot={}\n",
        pdisk.pdisk, pdisk.device, pdisk.enclosure, pdisk.slot
    )
}

#[cfg(test)]
#[path = "stanza_tests.rs"]
mod tests;
