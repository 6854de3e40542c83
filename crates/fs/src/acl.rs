//! POSIX access control lists (POSIX.1e draft 17, as Linux implements them): their extended
//! attribute format, the access check, and how they follow chmod and pass to new files.
//!
//! An inode's ACLs are stored as its `system.posix_acl_access` and `system.posix_acl_default`
//! extended attributes, in the binary format the kernel and `setfacl` exchange (a version 2
//! header, then entries of tag, permissions and id, all little-endian), so a getxattr returns
//! the stored bytes unchanged. The owner, owning-group (or mask) and other entries are mirrored
//! by the mode bits; an access ACL that says no more than the mode is not stored at all, as
//! ext4 and XFS do, so `ls -l` shows `+` exactly for files with extended ACLs.

use crate::error::{FsError, FsResult};

/// The extended attribute holding an inode's access ACL.
pub const ACCESS_XATTR: &[u8] = b"system.posix_acl_access";
/// The extended attribute holding a directory's default ACL (what new entries inherit).
pub const DEFAULT_XATTR: &[u8] = b"system.posix_acl_default";

/// `POSIX_ACL_XATTR_VERSION` of `<linux/posix_acl_xattr.h>`.
const VERSION: u32 = 2;
const HEADER_BYTES: usize = 4;
const ENTRY_BYTES: usize = 8;
/// Entries at most; the kernel's FUSE client refuses more (`FUSE_ACL_MAX_ENTRIES`), and 32
/// named users and groups per file is already beyond what ACL-managed project trees use.
pub const ENTRIES_MAX: usize = 32;
/// The id of entries that have none (owner, owning group, mask, other).
const NO_ID: u32 = u32::MAX;

/// Entry kinds, with the kernel's tag values; their order is the order of the check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tag {
    UserObj = 0x01,
    User = 0x02,
    GroupObj = 0x04,
    Group = 0x08,
    Mask = 0x10,
    Other = 0x20,
}

impl Tag {
    fn from_u16(v: u16) -> Option<Tag> {
        Some(match v {
            0x01 => Tag::UserObj,
            0x02 => Tag::User,
            0x04 => Tag::GroupObj,
            0x08 => Tag::Group,
            0x10 => Tag::Mask,
            0x20 => Tag::Other,
            _ => return None,
        })
    }

    fn named(self) -> bool {
        matches!(self, Tag::User | Tag::Group)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub tag: Tag,
    /// Read 4, write 2, execute 1.
    pub perm: u16,
    /// The uid or gid of a named entry; [`NO_ID`] otherwise.
    pub id: u32,
}

/// A valid ACL, its entries in the kernel's canonical order (by tag, then id).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acl {
    entries: Vec<Entry>,
}

fn invalid(what: String) -> FsError {
    FsError::Invalid(format!("POSIX ACL: {what}"))
}

impl Acl {
    /// Parses and checks an ACL in the extended attribute format: version 2, whole entries,
    /// known tags, permissions within rwx, exactly one owner, owning-group and other entry,
    /// a mask when there is a named entry (at most one), and no uid or gid named twice.
    pub fn decode(bytes: &[u8]) -> FsResult<Acl> {
        if bytes.len() < HEADER_BYTES || !(bytes.len() - HEADER_BYTES).is_multiple_of(ENTRY_BYTES) {
            return Err(invalid(format!(
                "{} bytes is not a 4-byte header and 8-byte entries",
                bytes.len()
            )));
        }
        let version = u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes"));
        if version != VERSION {
            return Err(invalid(format!("version {version}, expected {VERSION}")));
        }
        let mut entries = Vec::new();
        for e in bytes[HEADER_BYTES..].chunks_exact(ENTRY_BYTES) {
            let raw_tag = u16::from_le_bytes([e[0], e[1]]);
            let tag = Tag::from_u16(raw_tag)
                .ok_or_else(|| invalid(format!("unknown entry tag {raw_tag:#x}")))?;
            let perm = u16::from_le_bytes([e[2], e[3]]);
            if perm & !7 != 0 {
                return Err(invalid(format!("permissions {perm:#o} beyond rwx")));
            }
            let id = u32::from_le_bytes([e[4], e[5], e[6], e[7]]);
            let id = if tag.named() { id } else { NO_ID };
            entries.push(Entry { tag, perm, id });
        }
        Acl::new(entries)
    }

    /// An ACL from entries in any order, checked as [`Acl::decode`] does.
    pub fn new(mut entries: Vec<Entry>) -> FsResult<Acl> {
        if entries.len() > ENTRIES_MAX {
            return Err(invalid(format!(
                "{} entries, at most {ENTRIES_MAX} are kept",
                entries.len()
            )));
        }
        entries.sort_by_key(|e| (e.tag, e.id));
        let count = |tag| entries.iter().filter(|e| e.tag == tag).count();
        for tag in [Tag::UserObj, Tag::GroupObj, Tag::Other] {
            if count(tag) != 1 {
                return Err(invalid(format!("{} {tag:?} entries, need one", count(tag))));
            }
        }
        let named = entries.iter().any(|e| e.tag.named());
        match count(Tag::Mask) {
            0 if named => return Err(invalid("named entries without a mask entry".into())),
            0 | 1 => {}
            n => return Err(invalid(format!("{n} mask entries"))),
        }
        if let Some(w) = entries
            .windows(2)
            .find(|w| w[0].tag.named() && w[0].tag == w[1].tag && w[0].id == w[1].id)
        {
            return Err(invalid(format!("{:?} {} named twice", w[0].tag, w[0].id)));
        }
        Ok(Acl { entries })
    }

    /// The three-entry ACL the mode bits stand for.
    pub fn from_mode(mode: u32) -> Acl {
        let e = |tag, shift: u32| Entry {
            tag,
            perm: ((mode >> shift) & 7) as u16,
            id: NO_ID,
        };
        Acl {
            entries: vec![e(Tag::UserObj, 6), e(Tag::GroupObj, 3), e(Tag::Other, 0)],
        }
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_BYTES + ENTRY_BYTES * self.entries.len());
        out.extend_from_slice(&VERSION.to_le_bytes());
        for e in &self.entries {
            out.extend_from_slice(&(e.tag as u16).to_le_bytes());
            out.extend_from_slice(&e.perm.to_le_bytes());
            out.extend_from_slice(&e.id.to_le_bytes());
        }
        out
    }

    fn perm_of(&self, tag: Tag) -> Option<u16> {
        self.entries.iter().find(|e| e.tag == tag).map(|e| e.perm)
    }

    /// Whether the mode bits say all this ACL says (no named entries, no mask).
    pub fn is_minimal(&self) -> bool {
        self.entries.len() == 3
    }

    /// The permission bits (mode & 0o777) that mirror this ACL: the group bits show the
    /// mask when there is one, as `ls -l` and the kernel's `posix_acl_equiv_mode` do.
    pub fn mode_bits(&self) -> u32 {
        let p = |tag| u32::from(self.perm_of(tag).unwrap_or(0));
        let group = self.perm_of(Tag::Mask).unwrap_or(p(Tag::GroupObj) as u16);
        p(Tag::UserObj) << 6 | u32::from(group) << 3 | p(Tag::Other)
    }

    /// The kernel's `__posix_acl_chmod`: a chmod sets the owner, the mask (or the owning
    /// group when there is no mask) and the other entry; named entries keep their bits and
    /// are limited by the new mask.
    pub fn chmod(&mut self, mode: u32) {
        let has_mask = self.perm_of(Tag::Mask).is_some();
        for e in &mut self.entries {
            let shift = match e.tag {
                Tag::UserObj => 6,
                Tag::Mask => 3,
                Tag::GroupObj if !has_mask => 3,
                Tag::Other => 0,
                _ => continue,
            };
            e.perm = ((mode >> shift) & 7) as u16;
        }
    }

    /// The kernel's `posix_acl_create_masq`: the access ACL a new file gets from its
    /// directory's default ACL and the mode its creator asked for, and the mode to store.
    /// `None` for the ACL when the result says no more than the mode.
    pub fn inherit(default: &Acl, mode: u32) -> (Option<Acl>, u32) {
        let mut acl = default.clone();
        let mut mode = mode;
        for e in &mut acl.entries {
            match e.tag {
                Tag::UserObj => {
                    e.perm &= ((mode >> 6) & 7) as u16;
                    mode &= (u32::from(e.perm) << 6) | !0o700;
                }
                Tag::Other => {
                    e.perm &= (mode & 7) as u16;
                    mode &= u32::from(e.perm) | !0o007;
                }
                _ => {}
            }
        }
        let group_tag = if acl.perm_of(Tag::Mask).is_some() {
            Tag::Mask
        } else {
            Tag::GroupObj
        };
        for e in acl.entries.iter_mut().filter(|e| e.tag == group_tag) {
            e.perm &= ((mode >> 3) & 7) as u16;
            mode &= (u32::from(e.perm) << 3) | !0o070;
        }
        let acl = (!acl.is_minimal()).then_some(acl);
        (acl, mode)
    }

    /// The kernel's `posix_acl_permission` for someone who is not the owner (the owner gets
    /// the owner bits of the mode, which mirror the owner entry): a named-user entry, else
    /// the owning group and named groups the caller is in (any one granting all of `want`,
    /// limited by the mask), else other.
    pub fn permits(
        &self,
        uid: u32,
        file_gid: u32,
        in_group: impl Fn(u32) -> bool,
        want: u32,
    ) -> bool {
        let want = want & 7;
        let mask = u32::from(self.perm_of(Tag::Mask).unwrap_or(7));
        let granted = |perm: u16| u32::from(perm) & want == want;
        if let Some(e) = self
            .entries
            .iter()
            .find(|e| e.tag == Tag::User && e.id == uid)
        {
            return granted(e.perm) && mask & want == want;
        }
        let mut in_some_group = false;
        for e in &self.entries {
            let member = match e.tag {
                Tag::GroupObj => in_group(file_gid),
                Tag::Group => in_group(e.id),
                _ => false,
            };
            if member {
                in_some_group = true;
                if granted(e.perm) {
                    return mask & want == want;
                }
            }
        }
        !in_some_group && self.perm_of(Tag::Other).is_some_and(granted)
    }
}

/// Which of the two ACLs an extended attribute name is, if it is one.
pub fn acl_xattr(name: &[u8]) -> Option<AclKind> {
    if name == ACCESS_XATTR {
        Some(AclKind::Access)
    } else if name == DEFAULT_XATTR {
        Some(AclKind::Default)
    } else {
        None
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum AclKind {
    Access,
    Default,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(tag: Tag, perm: u16, id: u32) -> Entry {
        Entry { tag, perm, id }
    }

    /// u::rw-, u:1000:rwx, g::r--, g:50:rw-, m::rw-, o::---
    fn sample() -> Acl {
        Acl::new(vec![
            e(Tag::Other, 0, NO_ID),
            e(Tag::User, 7, 1000),
            e(Tag::UserObj, 6, NO_ID),
            e(Tag::Mask, 6, NO_ID),
            e(Tag::GroupObj, 4, NO_ID),
            e(Tag::Group, 6, 50),
        ])
        .unwrap()
    }

    #[test]
    fn encoding_is_the_kernels_and_round_trips() {
        let acl = Acl::from_mode(0o640);
        let bytes = acl.encode();
        // What `setfacl` hands the kernel for u::rw-,g::r--,o::---.
        let golden: Vec<u8> = [
            &2u32.to_le_bytes()[..],
            &[1, 0, 6, 0, 0xff, 0xff, 0xff, 0xff],
            &[4, 0, 4, 0, 0xff, 0xff, 0xff, 0xff],
            &[0x20, 0, 0, 0, 0xff, 0xff, 0xff, 0xff],
        ]
        .concat();
        assert_eq!(bytes, golden);
        assert_eq!(Acl::decode(&bytes).unwrap(), acl);
        let s = sample();
        assert_eq!(Acl::decode(&s.encode()).unwrap(), s);
        let tags: Vec<Tag> = s.entries().iter().map(|e| e.tag).collect();
        assert_eq!(
            tags,
            [
                Tag::UserObj,
                Tag::User,
                Tag::GroupObj,
                Tag::Group,
                Tag::Mask,
                Tag::Other
            ]
        );
    }

    #[test]
    fn malformed_values_are_refused() {
        let good = sample().encode();
        let bad = |b: &[u8]| matches!(Acl::decode(b), Err(FsError::Invalid(_)));
        assert!(bad(&[]));
        assert!(bad(&good[..good.len() - 1]));
        let mut v = good.clone();
        v[0] = 1;
        assert!(bad(&v), "version 1");
        let mut v = good.clone();
        v[4] = 0x40;
        assert!(bad(&v), "unknown tag");
        let mut v = good.clone();
        v[6] = 8;
        assert!(bad(&v), "perm beyond rwx");
        // Missing the other entry; a named user without a mask; a user named twice.
        assert!(Acl::new(vec![e(Tag::UserObj, 7, NO_ID), e(Tag::GroupObj, 7, NO_ID)]).is_err());
        let no_mask = vec![
            e(Tag::UserObj, 7, NO_ID),
            e(Tag::User, 7, 5),
            e(Tag::GroupObj, 7, NO_ID),
            e(Tag::Other, 7, NO_ID),
        ];
        assert!(Acl::new(no_mask.clone()).is_err());
        let mut twice = no_mask;
        twice.push(e(Tag::User, 4, 5));
        twice.push(e(Tag::Mask, 7, NO_ID));
        assert!(Acl::new(twice).is_err());
        let many: Vec<Entry> = (0..40).map(|i| e(Tag::User, 4, i)).collect();
        assert!(Acl::new(many).is_err());
    }

    #[test]
    fn mode_mirrors_owner_mask_and_other() {
        assert_eq!(sample().mode_bits(), 0o660);
        assert_eq!(Acl::from_mode(0o754).mode_bits(), 0o754);
        assert!(Acl::from_mode(0o754).is_minimal() && !sample().is_minimal());
        let mut acl = sample();
        acl.chmod(0o705);
        assert_eq!(acl.mode_bits(), 0o705);
        // Named entries keep their bits, limited by the new (empty) mask.
        assert_eq!(acl.entries()[1], e(Tag::User, 7, 1000));
        assert!(!acl.permits(1000, 100, |_| false, 4));
        let mut plain = Acl::from_mode(0o644);
        plain.chmod(0o751);
        assert_eq!(plain, Acl::from_mode(0o751));
    }

    #[test]
    fn access_check_named_user_groups_mask_other() {
        let acl = sample();
        let none = |_| false;
        // Named user: rwx, limited to rw by the mask.
        assert!(acl.permits(1000, 100, none, 6));
        assert!(!acl.permits(1000, 100, none, 1));
        // Named group 50: rw-.
        assert!(acl.permits(7, 100, |g| g == 50, 6));
        // Owning group: r--; a member of both groups gets what either grants whole.
        assert!(acl.permits(7, 100, |g| g == 100, 4));
        assert!(!acl.permits(7, 100, |g| g == 100, 2));
        assert!(acl.permits(7, 100, |g| g == 100 || g == 50, 6));
        // A member of a group that does not grant is not "other".
        let open_other = Acl::new(vec![
            e(Tag::UserObj, 7, NO_ID),
            e(Tag::GroupObj, 0, NO_ID),
            e(Tag::Other, 7, NO_ID),
        ])
        .unwrap();
        assert!(!open_other.permits(7, 100, |g| g == 100, 4));
        assert!(open_other.permits(7, 100, none, 4));
        assert!(!acl.permits(7, 100, none, 4));
    }

    #[test]
    fn inheritance_masks_the_mode_with_the_default_acl() {
        // d:u::rwx, d:u:1000:rwx, d:g::r-x, d:g:50:rw-, d:m::rwx, d:o::---
        let default = Acl::new(vec![
            e(Tag::UserObj, 7, NO_ID),
            e(Tag::User, 7, 1000),
            e(Tag::GroupObj, 5, NO_ID),
            e(Tag::Group, 6, 50),
            e(Tag::Mask, 7, NO_ID),
            e(Tag::Other, 0, NO_ID),
        ])
        .unwrap();
        // open(O_CREAT, 0666): the mask takes the group bits of the mode.
        let (acl, mode) = Acl::inherit(&default, 0o666);
        let acl = acl.unwrap();
        assert_eq!(mode, 0o660);
        assert_eq!(acl.mode_bits(), 0o660);
        assert!(acl.permits(1000, 1, |_| false, 6));
        assert!(!acl.permits(1000, 1, |_| false, 1));
        // mkdir(0777) keeps everything the default grants.
        let (acl, mode) = Acl::inherit(&default, 0o777);
        assert_eq!(mode, 0o770);
        assert_eq!(acl.unwrap().entries()[1], e(Tag::User, 7, 1000));
        // A default ACL that is only the mode gives no access ACL.
        let (acl, mode) = Acl::inherit(&Acl::from_mode(0o750), 0o666);
        assert_eq!((acl, mode), (None, 0o640));
    }
}
