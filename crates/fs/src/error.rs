//! Errors of the file-system core. Every variant maps to an errno at the FUSE edge and
//! carries enough words to tell an administrator what to do.

use std::io;

use tessera_alloc::AllocError;
use tessera_journal::JournalError;

#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error("no such file or directory")]
    NotFound,
    #[error("file exists")]
    Exists,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("directory not empty")]
    NotEmpty,
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("file name too long (the limit is 255 bytes)")]
    NameTooLong,
    #[error("operation not supported: {0}")]
    NotSupported(String),
    #[error("no such attribute")]
    NoXattr,
    #[error("attribute value does not fit the {size}-byte buffer")]
    Range { size: usize },
    #[error("too many links")]
    TooManyLinks,
    #[error("file too large")]
    FileTooLarge,
    #[error("no space left in storage pool '{pool}' for {what}; add disks or delete files")]
    NoSpace { pool: String, what: &'static str },
    #[error("inode limit of {max} reached; raise it with --inode-limit or delete files")]
    NoInodes { max: u64 },
    #[error("checksum mismatch on NSD {nsd} at byte {offset} (file inode {ino}); the data is not returned")]
    Checksum { nsd: String, offset: u64, ino: u64 },
    // Inner errors are part of the message and deliberately not a `source()`, so that
    // printing the chain (`{:#}`) does not repeat them.
    #[error("I/O error: {0}")]
    Io(io::Error),
    #[error("journal: {0}")]
    Journal(JournalError),
    #[error("corrupt file system metadata: {0}; run `tessera fsck DEVICE -n` to inspect")]
    Corrupt(String),
    #[error("disk {nsd} of file system {fs} is not available: {reason}")]
    MissingDisk {
        fs: String,
        nsd: String,
        reason: String,
    },
    #[error("no valid file system descriptor found: {0}")]
    NoDescriptor(String),
    #[error("this node was fenced from the file system and can no longer write; remount it")]
    Fenced,
    #[error("read-only file system")]
    ReadOnly,
    #[error("{0}")]
    Usage(String),
    /// The mode bits of the file or a directory on its path deny the caller (EACCES).
    #[error("permission denied by the mode bits of the file or of its directory")]
    PermissionDenied,
    /// Only the owner or root may do this (EPERM).
    #[error("operation not permitted: {0}")]
    NotPermitted(String),
    /// An administrative operation on a client-only mount that only the node owning the
    /// file system's metadata can do.
    #[error(
        "{what} needs the metadata of file system {fs}, which another node owns; run it on \
         that node (`tessera mount ls {fs} -L` names it)"
    )]
    NotOwner { what: String, fs: String },
    /// The owner of the file system's metadata changed (it died and another node took
    /// over, or it restarted) while a client's request was built on what the old owner
    /// showed or gave it: nothing of the request reached the new owner or the disks. The
    /// data path starts such a write again; anything else fails with EIO.
    #[error(
        "the node owning the metadata of this file system changed during the operation \
         (it died and another node took over); the operation was not done, try it again"
    )]
    OwnerMoved,
    /// A lock another holder has (EAGAIN from `F_SETLK`).
    #[error("a conflicting lock is held")]
    WouldBlock,
    /// A waiting lock request was interrupted by a signal (EINTR).
    #[error("interrupted while waiting for a lock")]
    Interrupted,
    /// An inode whose shard this owner does not hold: the owner map gives it to another
    /// owner slot, whose owner serves it.
    #[error(
        "inode shard {shard} is owned by another node's owner slot; the request goes to that \
         node"
    )]
    ShardElsewhere { shard: u32 },
    /// A name found in a directory this owner serves names an inode of a shard another
    /// owner slot serves (or, found among the names a client holds, an inode whose
    /// attributes it does not hold): the client asks whoever serves the inode for them.
    #[error("inode {ino} is served by another node's owner slot")]
    InodeElsewhere { ino: u64 },
    /// A rename or link whose names or inode different nodes' owner slots serve: an
    /// owner's answer, on which the client takes the operation in steps
    /// (`across_owners.rs`); what reaches a caller is what no steps are built for yet
    /// (EXDEV, on which `mv` copies and removes instead).
    #[error("{0} is not supported yet (EXDEV: copy and remove instead)")]
    AcrossOwners(String),
    /// An error of the metanode on another node that has no variant of its own here.
    #[error("{message}")]
    Remote { errno: i32, message: String },
}

impl FsError {
    /// The errno a POSIX caller sees.
    pub fn errno(&self) -> i32 {
        match self {
            FsError::NotFound => libc::ENOENT,
            FsError::Exists => libc::EEXIST,
            FsError::NotDir => libc::ENOTDIR,
            FsError::IsDir => libc::EISDIR,
            FsError::NotEmpty => libc::ENOTEMPTY,
            FsError::Invalid(_) | FsError::Usage(_) => libc::EINVAL,
            FsError::NameTooLong => libc::ENAMETOOLONG,
            FsError::NotSupported(_) => libc::EOPNOTSUPP,
            FsError::NoXattr => libc::ENODATA,
            FsError::Range { .. } => libc::ERANGE,
            FsError::TooManyLinks => libc::EMLINK,
            FsError::FileTooLarge => libc::EFBIG,
            FsError::NoSpace { .. } | FsError::NoInodes { .. } => libc::ENOSPC,
            FsError::ReadOnly => libc::EROFS,
            FsError::PermissionDenied => libc::EACCES,
            FsError::NotPermitted(_) => libc::EPERM,
            FsError::NotOwner { .. } => libc::EOPNOTSUPP,
            FsError::AcrossOwners(_) => libc::EXDEV,
            FsError::WouldBlock => libc::EAGAIN,
            FsError::Interrupted => libc::EINTR,
            FsError::Remote { errno, .. } => *errno,
            FsError::Journal(JournalError::Full { .. }) => libc::ENOSPC,
            FsError::Checksum { .. }
            | FsError::Io(_)
            | FsError::Journal(_)
            | FsError::Corrupt(_)
            | FsError::MissingDisk { .. }
            | FsError::NoDescriptor(_)
            | FsError::Fenced
            | FsError::ShardElsewhere { .. }
            | FsError::InodeElsewhere { .. }
            | FsError::OwnerMoved => libc::EIO,
        }
    }

    pub(crate) fn from_alloc(e: AllocError, pool: &str, what: &'static str) -> FsError {
        match e {
            AllocError::NoSpace { .. } => FsError::NoSpace {
                pool: pool.to_string(),
                what,
            },
            other => FsError::Corrupt(format!("allocation map: {other}")),
        }
    }
}

pub type FsResult<T> = Result<T, FsError>;

impl From<io::Error> for FsError {
    fn from(e: io::Error) -> FsError {
        FsError::Io(e)
    }
}

impl From<JournalError> for FsError {
    fn from(e: JournalError) -> FsError {
        FsError::Journal(e)
    }
}
