//! The metanode interface as messages: every call a client makes to the metanode of a file
//! ([`Metanode`], [`Namespace`]) or to its block allocator ([`BlockAllocator`]) as one
//! [`MetanodeRequest`] and one [`MetanodeReply`], postcard-encoded, with errors carried as
//! [`RemoteError`]. [`serve`] answers a request from an owner; [`RemoteMetanode`] is the
//! client's end, implementing the three traits over a [`MetanodeChannel`] that moves the
//! encoded bytes. The cluster transport will be one such channel; [`Loopback`] is another,
//! which sends every request of this node's own client through its encoding to this node's
//! own owner: with `TESSERA_METANODE_LOOPBACK=1` at mount, the file system's whole test
//! suite runs through the wire form, so a request that does not survive encoding, or an
//! answer the client cannot take, shows up before any second node exists.
//!
//! A restripe's moves (`BlockAllocator::allocate_on`, whose disk filter is a closure) are
//! not part of the wire: a restripe runs where the file system manager owns the metadata.

use std::ops::Range;
use std::sync::{Arc, Weak};

use serde::{Deserialize, Serialize};
use tessera_alloc::{BlockHint, DiskIndex, Extent, PoolId};
use tessera_journal::Lsn;

use crate::access::Protection;
use crate::acl::{Acl, AclKind};
use crate::disk_set::DiskSet;
use crate::error::{FsError, FsResult};
use crate::fs::FileSystem;
use crate::inode::{Attr, FileKind, Ino};
use crate::locks::{Lock, LockCall};
use crate::meta::Change;
use crate::metanode::{
    BlockAllocator, FileUpdate, FileView, Metanode, Namespace, NewNode, RenameHow, XattrHow,
};
use crate::namespace::{DirListing, SetAttr, StatFs};

/// Largest encoded request or reply accepted: a view of many blocks, a readdir batch or a
/// 64 KiB xattr value fit with room to spare; anything larger is a broken peer.
pub const MESSAGE_BYTES_MAX: usize = 16 << 20;

/// One call of a client to a metanode. Field order is the wire order (postcard); new
/// variants go last.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum MetanodeRequest {
    View {
        ino: Ino,
        blocks: Range<u64>,
    },
    Update {
        ino: Ino,
        update: FileUpdate,
    },
    Commit {
        lsn: Lsn,
    },
    CommitData {
        lsn: Lsn,
        disks: Vec<u16>,
    },
    Accessed {
        ino: Ino,
    },
    Allocate {
        pool: PoolId,
        sub_blocks: u32,
        hint: BlockHint,
        what: AllocPurpose,
    },
    Abandon {
        extent: Extent,
    },
    AllocateCopies {
        pool: PoolId,
        sub_blocks: u32,
        hint: BlockHint,
        copies: u8,
        what: AllocPurpose,
    },
    Attr {
        ino: Ino,
    },
    HeldBytes {
        ino: Ino,
    },
    /// `Attr` and `HeldBytes` in one (a `stat`).
    AttrBytes {
        ino: Ino,
    },
    Find {
        parent: Ino,
        name: Vec<u8>,
    },
    Make {
        parent: Ino,
        name: Vec<u8>,
        node: NewNode,
    },
    LinkTarget {
        ino: Ino,
    },
    DropName {
        parent: Ino,
        name: Vec<u8>,
        dir: bool,
    },
    SealDir {
        ino: Ino,
        named_in: Option<Ino>,
    },
    DropEntryOf {
        parent: Ino,
        name: Vec<u8>,
        ino: Ino,
    },
    DropSealedDir {
        ino: Ino,
    },
    /// To the file system manager: make an owner slot for the asking node
    /// (`FileSystem::provide_slot`); answered with its number.
    ProvideSlot,
    AddName {
        ino: Ino,
        parent: Ino,
        name: Vec<u8>,
    },
    MoveName {
        from: (Ino, Vec<u8>),
        to: (Ino, Vec<u8>),
        how: RenameHow,
    },
    ChangeAttr {
        ino: Ino,
        set: SetAttr,
    },
    Opened {
        ino: Ino,
    },
    Closed {
        ino: Ino,
    },
    Entries {
        ino: Ino,
        after: u64,
    },
    Space,
    PutXattr {
        ino: Ino,
        name: Vec<u8>,
        value: Vec<u8>,
        how: XattrHow,
    },
    Xattr {
        ino: Ino,
        name: Vec<u8>,
    },
    XattrNames {
        ino: Ino,
    },
    DropXattr {
        ino: Ino,
        name: Vec<u8>,
    },
    PutAcl {
        ino: Ino,
        kind: AclKind,
        value: Vec<u8>,
        how: XattrHow,
        drop_setgid: bool,
    },
    Protection {
        ino: Ino,
    },
    /// The one message that goes the other way, from a new owner to a client, before the
    /// new owner serves anything: node `owner` in incarnation `incarnation` owns the
    /// metadata now. The client sends to it from then on and answers once no data write of
    /// its own that relied on the old owner (space it gave out, a block map it showed) is
    /// in flight or can still start, so that space the new owner gives out is nobody
    /// else's (see [`RemoteMetanode::fence`]).
    ///
    /// `slot` says which of the file system's metanodes moved: 0 the file system manager,
    /// another number the owner of that slot (`FileSystem::mount_slot`), whose clients
    /// fence only what they did under it.
    FenceWrites {
        owner: u32,
        incarnation: u64,
        slot: u32,
    },
    /// The second half of a fence: the new owner of `slot` applied the updates the client
    /// handed it (`MetanodeReply::Replay`) and made them durable (`replayed`), or could not.
    FenceSettled {
        replayed: bool,
        slot: u32,
    },
    /// A namespace change (create, link, unlink, rename) as request `seq` of client
    /// `client` (random per mount), so that it is done once however often it is sent: the
    /// owner logs that it was done with it (`Change::Answered`) and answers a retry, at
    /// itself or at the node that took it over, with its result. The request inside is
    /// never itself `Once`: decoding refuses it (`once_inner`), so no sender can make the
    /// decoder recurse deeper than one level.
    Once {
        client: u64,
        seq: u64,
        #[serde(deserialize_with = "once_inner")]
        request: Box<MetanodeRequest>,
    },
    /// An `fcntl`, `flock` or append lock of a file (see `locks.rs`): granted (or, with
    /// `call.test`, free) when the answer holds no conflicting lock.
    Lock {
        ino: Ino,
        call: LockCall,
    },
    /// Owner to client: drop what you hold of these inodes (views, attributes, names;
    /// `read_tokens.rs`).
    DropHeld {
        inos: Vec<Ino>,
    },
    /// Owner to client: give back the data tokens you keep for these files, once your
    /// writes under them are done (`locks.rs`, `KeptToken`). Apart from `DropHeld`, which is
    /// answered at once: a change that revokes names or attributes (an access time a read
    /// on the owner set) must never wait for a write, which may itself wait for that read.
    GiveBackData {
        inos: Vec<Ino>,
    },
    /// File system manager to every node that mounts the file system, after an
    /// administrative change of the descriptor that they must follow (`disk add`, a disk's
    /// status, the placement policy, the replication of new files): read it again, open
    /// new disks, and (an owner slot's node) allocate and create as it now says
    /// (`FileSystem::follow_descriptor`). A node that misses it learns new disks when it
    /// first meets one of their block addresses.
    DescriptorChanged,
    /// File system manager to every node that mounts the file system, after `disk change
    /// stop|start` there [mmchdisk]: stop (or start) I/O to these NSDs on this node too
    /// (`FileSystem::stop_disks`, `start_disks`).
    DiskAvailability {
        nsds: Vec<String>,
        up: bool,
    },
    /// Client to owner at its unmount: forget what this node holds (`read_tokens.rs`).
    /// Without it the owner kept the node recorded as a holder of every inode it had
    /// read until a change revoked each one (a round trip to a mount that is gone), and a
    /// client that had read many files left the owner's bounded table full, so that other
    /// nodes were granted nothing new.
    Leaving,
    /// A step of a rename or link across owners ([`Namespace::put_entry`]).
    PutEntry {
        dir: Ino,
        name: Vec<u8>,
        ino: Ino,
        kind: FileKind,
        replace: Option<Ino>,
    },
    /// A step of a rename or unlink across owners ([`Namespace::take_entry`]).
    TakeEntry {
        dir: Ino,
        name: Vec<u8>,
        ino: Ino,
    },
    /// A step of an operation across owners ([`Namespace::count_link`]).
    CountLink {
        ino: Ino,
        up: bool,
    },
    /// A step of a directory's move across owners ([`Namespace::reparent`]).
    Reparent {
        dir: Ino,
        from: Ino,
        to: Ino,
    },
    /// The free space of the regions an owner allocates in ([`Namespace::disk_free`]).
    DiskFree,
    /// The pool a file is placed in ([`Namespace::file_pool`]).
    FilePool {
        ino: Ino,
    },
    /// `policy apply`'s MIGRATE of a file this owner serves ([`Namespace::migrate_file`]).
    MigrateFile {
        ino: Ino,
        pool: u16,
        move_data: bool,
    },
    /// A batch of the file system manager's restripe of a shard this owner holds
    /// ([`Namespace::restripe_batch`]).
    RestripeBatch {
        mode: crate::restripe::RestripeMode,
        shard: u32,
        cursor: crate::restripe::RestripeCursor,
    },
    /// Up to `count` fragments of `sub_blocks` each, for the first blocks of new small
    /// files ([`BlockAllocator::allocate_fragments`]): a client keeps the ones it does not
    /// use at once, so that a small file's write asks no allocation of its own.
    AllocateFragments {
        pool: PoolId,
        sub_blocks: u32,
        count: u32,
        what: AllocPurpose,
    },
    /// Client to owner: the whole-file data tokens `holder` kept for these files go back
    /// at once (`locks.rs`, `KeptTokens`): a client whose table of kept tokens is full
    /// gives back a batch of unused ones in one request, not one `Lock` per file.
    DropKept {
        holder: crate::locks::Holder,
        inos: Vec<Ino>,
    },
    /// To the file system manager, from the owner of slot `slot` whose allocation regions
    /// are full: give it another wholly free region (`FileSystem::provide_region`);
    /// answered with the region's number.
    ProvideRegion {
        slot: u32,
    },
    /// To the node that took over the owner slot addressed, from the node the slot was
    /// made for, which mounts again: stop serving it and name the sender its holder.
    /// Answered by the daemon ([`SlotHandBack`]), not by a mount.
    GiveSlotBack,
    /// To the owner of the slot addressed, from the file system manager whose regions are
    /// full or which has none for a full slot: give back an allocation region with nothing
    /// in it (`FileSystem::give_region_back`); answered with its number once the slot's
    /// record no longer stores it.
    GiveRegionBack,
    /// Client to owner: let this mount gather small writes of `ino` in its memory under
    /// the data token it keeps for the file (`write_behind.rs`); answered with a count, 1
    /// if granted, 0 if not (the token was taken back meanwhile).
    Gather {
        ino: Ino,
    },
    /// A batch of the file system manager's `restripe -m`: this owner writes up to
    /// `budget` of its metadata pages that lie on disks that are not ready elsewhere, by a
    /// checkpoint of its own ([`Namespace::move_pages_off`]); answered with how many it
    /// moved, 0 once none is left there.
    MovePagesOff {
        budget: u32,
    },
    /// From the file system manager's `disk delete`, once its restripe emptied the disks:
    /// this owner checks that nothing of its own is left on them, lets go of them (its
    /// allocator and its map's digest leave them out) and says so in its record
    /// ([`Namespace::drop_disks`]), so that the manager can remove them.
    DropDisks {
        disks: Vec<u16>,
    },
    /// From the file system manager moving allocation-map regions that this owner slot
    /// writes chunks of ([`Namespace::hold_map_writes`], `map_hold.rs`): hold (or confirm
    /// the hold of) the slot's chunk writes for move `id`, or release them.
    HoldMapWrites {
        hold: bool,
        id: u64,
    },
    /// From the file system manager moving this owner slot's region (records and log) to
    /// `to`, which the descriptor on disk reserves ([`Namespace::move_slot_region`],
    /// `slot_move.rs`), or giving that move up.
    MoveSlotRegion {
        to: crate::slot::SlotRegion,
        give_up: bool,
    },
    /// From the owner of `slot` (`-m 2`) to the file system manager: record in the
    /// descriptor which copy of the slot's log `log_id` lacks records (`None`: both are
    /// current), before the slot writes a record that one copy alone holds
    /// ([`Namespace::record_slot_log`]).
    RecordSlotLog {
        slot: u32,
        log_id: [u8; 16],
        behind: Option<u8>,
    },
    /// From the file system manager's `restripe -c`/`-r` (`rewrite`) on a `-m 2` file
    /// system, to the owner of another slot: check and repair the copies of its pages, and
    /// with `rewrite` restore its log copy and map chunks ([`Namespace::restore_copies`]).
    /// Answered with `Restriped` (`scanned`: copies checked, `changed`: repaired).
    RestoreCopies {
        rewrite: bool,
    },
}

/// The name of the encoded metanode request `request` (as the counters of what a mount
/// asks name it), or `None` if it does not decode: for logs, and for tests' channels that
/// lose chosen requests.
pub fn request_kind(request: &[u8]) -> Option<&'static str> {
    decode::<MetanodeRequest>(request, "request")
        .ok()
        .map(|r| r.kind())
}

impl MetanodeRequest {
    /// The request's name, for the counters of what a mount asks other nodes (a `Once`
    /// counts as the request it carries).
    pub(crate) fn kind(&self) -> &'static str {
        use MetanodeRequest as Q;
        match self {
            Q::View { .. } => "View",
            Q::Update { .. } => "Update",
            Q::Commit { .. } => "Commit",
            Q::CommitData { .. } => "CommitData",
            Q::Accessed { .. } => "Accessed",
            Q::Allocate { .. } => "Allocate",
            Q::Abandon { .. } => "Abandon",
            Q::AllocateCopies { .. } => "AllocateCopies",
            Q::Attr { .. } => "Attr",
            Q::HeldBytes { .. } => "HeldBytes",
            Q::AttrBytes { .. } => "AttrBytes",
            Q::Find { .. } => "Find",
            Q::Make { .. } => "Make",
            Q::LinkTarget { .. } => "LinkTarget",
            Q::DropName { .. } => "DropName",
            Q::SealDir { .. } => "SealDir",
            Q::DropEntryOf { .. } => "DropEntryOf",
            Q::DropSealedDir { .. } => "DropSealedDir",
            Q::ProvideSlot => "ProvideSlot",
            Q::AddName { .. } => "AddName",
            Q::MoveName { .. } => "MoveName",
            Q::ChangeAttr { .. } => "ChangeAttr",
            Q::Opened { .. } => "Opened",
            Q::Closed { .. } => "Closed",
            Q::Entries { .. } => "Entries",
            Q::Space => "Space",
            Q::PutXattr { .. } => "PutXattr",
            Q::Xattr { .. } => "Xattr",
            Q::XattrNames { .. } => "XattrNames",
            Q::DropXattr { .. } => "DropXattr",
            Q::PutAcl { .. } => "PutAcl",
            Q::Protection { .. } => "Protection",
            Q::FenceWrites { .. } => "FenceWrites",
            Q::FenceSettled { .. } => "FenceSettled",
            Q::Once { request, .. } => request.kind(),
            Q::Lock { .. } => "Lock",
            Q::DropHeld { .. } => "DropHeld",
            Q::GiveBackData { .. } => "GiveBackData",
            Q::Leaving => "Leaving",
            Q::DescriptorChanged => "DescriptorChanged",
            Q::DiskAvailability { .. } => "DiskAvailability",
            Q::PutEntry { .. } => "PutEntry",
            Q::TakeEntry { .. } => "TakeEntry",
            Q::CountLink { .. } => "CountLink",
            Q::Reparent { .. } => "Reparent",
            Q::DiskFree => "DiskFree",
            Q::RestripeBatch { .. } => "RestripeBatch",
            Q::FilePool { .. } => "FilePool",
            Q::MigrateFile { .. } => "MigrateFile",
            Q::AllocateFragments { .. } => "AllocateFragments",
            Q::DropKept { .. } => "DropKept",
            Q::ProvideRegion { .. } => "ProvideRegion",
            Q::GiveSlotBack => "GiveSlotBack",
            Q::GiveRegionBack => "GiveRegionBack",
            Q::Gather { .. } => "Gather",
            Q::MovePagesOff { .. } => "MovePagesOff",
            Q::DropDisks { .. } => "DropDisks",
            Q::HoldMapWrites { .. } => "HoldMapWrites",
            Q::MoveSlotRegion { .. } => "MoveSlotRegion",
            Q::RecordSlotLog { .. } => "RecordSlotLog",
            Q::RestoreCopies { .. } => "RestoreCopies",
        }
    }
}

std::thread_local! {
    /// The file whose data token the owner granted with this thread's last create
    /// (`NewNode::keep_data`), for `FileSystem::create_open` to record.
    pub(crate) static MADE_KEPT: std::cell::Cell<Option<Ino>> = const { std::cell::Cell::new(None) };
    /// How many `Once` requests the decoder of this thread is inside.
    static ONCE_DEPTH: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Decodes the request inside a `Once`, refusing another `Once` inside it before decoding
/// goes deeper: a message of nested `Once`s, three bytes a level, would otherwise recurse
/// once per level and overflow the serving thread's stack.
fn once_inner<'de, D>(decoder: D) -> Result<Box<MetanodeRequest>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    if ONCE_DEPTH.get() > 0 {
        return Err(serde::de::Error::custom(
            "a request inside a request inside Once",
        ));
    }
    ONCE_DEPTH.set(1);
    let inner = MetanodeRequest::deserialize(decoder);
    ONCE_DEPTH.set(0);
    inner.map(Box::new)
}

/// The messages of a new owner's fence ([`MetanodeRequest::FenceWrites`]), for the daemon
/// that carries them.
pub struct Fence;

impl Fence {
    /// The encoded fence of node `owner` in incarnation `incarnation`, the new owner of
    /// `slot` (0: the file system manager).
    pub fn request(slot: u32, owner: u32, incarnation: u64) -> Vec<u8> {
        encode(&MetanodeRequest::FenceWrites {
            owner,
            incarnation,
            slot,
        })
    }

    /// The encoded second half of a fence of `slot`: the client's updates were `replayed`
    /// (applied and durable at the new owner), or not.
    pub fn settled(slot: u32, replayed: bool) -> Vec<u8> {
        encode(&MetanodeRequest::FenceSettled { replayed, slot })
    }

    /// Whether `request` is one half of a fence, or another message of an owner to its
    /// clients (answered by a node whatever it mounts: one that has no client mount has
    /// no write to fence and no view to drop).
    pub fn is_fence(request: &[u8]) -> bool {
        matches!(
            decode::<MetanodeRequest>(request, "request"),
            Ok(MetanodeRequest::FenceWrites { .. }
                | MetanodeRequest::FenceSettled { .. }
                | MetanodeRequest::DropHeld { .. }
                | MetanodeRequest::GiveBackData { .. }
                | MetanodeRequest::DescriptorChanged
                | MetanodeRequest::DiskAvailability { .. })
        )
    }

    /// Whether `request` is news every metanode instance a node serves must follow, not
    /// only its own mount: a descriptor change, or disks stopped or started. (An owner
    /// slot taken over from another node follows the descriptor as that node's mount
    /// would.)
    pub fn is_for_every_metanode(request: &[u8]) -> bool {
        matches!(
            decode::<MetanodeRequest>(request, "request"),
            Ok(MetanodeRequest::DescriptorChanged | MetanodeRequest::DiskAvailability { .. })
        )
    }

    /// Whether `request` is an owner's revocation of what a client holds (`DropHeld`,
    /// `GiveBackData`).
    pub fn is_revocation(request: &[u8]) -> bool {
        matches!(
            decode::<MetanodeRequest>(request, "request"),
            Ok(MetanodeRequest::DropHeld { .. } | MetanodeRequest::GiveBackData { .. })
        )
    }

    /// The encoded news that the descriptor changed ([`MetanodeRequest::DescriptorChanged`]).
    pub fn descriptor_changed() -> Vec<u8> {
        encode(&MetanodeRequest::DescriptorChanged)
    }

    /// The encoded request that a node stop (or start) I/O to `nsds`
    /// ([`MetanodeRequest::DiskAvailability`]).
    pub fn disk_availability(nsds: Vec<String>, up: bool) -> Vec<u8> {
        encode(&MetanodeRequest::DiskAvailability { nsds, up })
    }

    /// Whether `request` is [`Fence::descriptor_changed`]'s.
    pub fn is_descriptor_changed(request: &[u8]) -> bool {
        matches!(
            decode::<MetanodeRequest>(request, "request"),
            Ok(MetanodeRequest::DescriptorChanged)
        )
    }

    /// The encoded request that a client give back the data tokens it keeps for `inos`.
    pub fn give_back_data(inos: Vec<Ino>) -> Vec<u8> {
        encode(&MetanodeRequest::GiveBackData { inos })
    }

    /// The encoded revocation of what a client holds of `inos` (see `read_tokens.rs`).
    pub fn drop_held(inos: Vec<Ino>) -> Vec<u8> {
        encode(&MetanodeRequest::DropHeld { inos })
    }

    /// The answer of a node that has nothing to fence.
    pub fn done() -> Vec<u8> {
        encode(&MetanodeReply::Done)
    }

    /// Whether `reply` to [`Fence::settled`] says the client took note.
    pub fn check(reply: &[u8]) -> FsResult<()> {
        match decode::<MetanodeReply>(reply, "reply")? {
            MetanodeReply::Done => Ok(()),
            MetanodeReply::Failed(e) => Err(e.into()),
            other => Err(mismatch(other, "done")),
        }
    }
}

/// What an allocation is for; it names the request in a no-space error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AllocPurpose {
    FileData,
    Fallocate,
    MovedFileData,
}

impl AllocPurpose {
    fn of(what: &str) -> AllocPurpose {
        match what {
            "fallocate" => AllocPurpose::Fallocate,
            "moved file data" => AllocPurpose::MovedFileData,
            _ => AllocPurpose::FileData,
        }
    }

    fn label(self) -> &'static str {
        match self {
            AllocPurpose::FileData => "file data",
            AllocPurpose::Fallocate => "fallocate",
            AllocPurpose::MovedFileData => "moved file data",
        }
    }
}

/// A metanode's answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum MetanodeReply {
    Done,
    View(FileView),
    Lsn(Lsn),
    Extent(Extent),
    Extents(Vec<Extent>),
    Attr(Attr),
    Count(u64),
    Bytes(Vec<u8>),
    Listing(DirListing),
    Space(StatFs),
    /// The attributes and the encoded access ACL.
    Protection(Attr, Option<Vec<u8>>),
    Failed(RemoteError),
    /// A fenced client's updates that the old owner acknowledged and may not have made
    /// durable, in the order it acknowledged them: the new owner applies them before it
    /// serves (`FileSystem::replay_fenced`).
    Replay(Vec<(Ino, FileUpdate)>),
    /// The lock that keeps a [`MetanodeRequest::Lock`] from being granted, if any.
    Lock(Option<Lock>),
    /// A fenced client's answer when it holds locks or has files open: its unsynced
    /// updates (as in `Replay`), every lock the old owner granted its processes, which the
    /// new owner holds for them from then on, and how often each inode is open there
    /// (the new owner counts them, so an inode unlinked while open stays until its last
    /// close on that node).
    Handover {
        updates: Vec<(Ino, FileUpdate)>,
        locks: Vec<(Ino, Lock)>,
        open: Vec<(Ino, u32)>,
    },
    /// A view the client may keep until the owner sends [`MetanodeRequest::DropHeld`].
    HeldView(FileView),
    /// What a `Make` made, with the bytes it holds and, for a regular file, its view and
    /// whether the data token it asked to keep was granted; only ever inside `Held` (a
    /// client reads a plain `Attr` otherwise).
    Made(Attr, u64, Option<FileView>, bool),
    /// What a `Find` found, with the bytes it holds, kept under the inode's token; the name
    /// too when it says so (its directory's token was granted); only ever inside `Held`.
    Found(Attr, u64, bool),
    /// The answer to `AttrBytes`.
    AttrBytes(Attr, u64),
    /// An answer to `Attr`, `HeldBytes`, `Protection` or `Find` the client may keep until
    /// the owner sends [`MetanodeRequest::DropHeld`] (`read_tokens.rs`).
    Held(HeldReply),
    /// The answer (encoded, never itself `Changed`) to a request that changed inodes the
    /// client holds: it drops them (`inos`; `None`: everything, when the owner cannot
    /// say, as for a retry it had answered before) and keeps `fresh`, their attributes
    /// and bytes held as the change left them (it still holds them).
    Changed {
        inos: Option<Vec<Ino>>,
        reply: Vec<u8>,
        fresh: Vec<(Attr, u64)>,
    },
    /// The answer to `DiskFree`: per disk, its index, whole blocks free and sub-blocks
    /// free inside partly used blocks.
    DiskFree(Vec<(u32, u64, u64)>),
    /// The answer to `RestripeBatch`.
    Restriped(crate::restripe::RestripeBatch),
    /// The answer (encoded, never itself `Early`) to a namespace change of another node's
    /// client that the owner logged at `lsn` and answered before that was durable
    /// ([`answered_early`]): the client keeps the request until a commit covers `lsn`,
    /// and hands it to a new owner if this one dies first.
    Early {
        lsn: Lsn,
        reply: Vec<u8>,
    },
    /// [`MetanodeReply::Replay`] with namespace changes among the updates.
    ReplayChanges(Vec<HandedChange>),
    /// [`MetanodeReply::Handover`] with namespace changes among the updates.
    HandoverChanges {
        changes: Vec<HandedChange>,
        locks: Vec<(Ino, Lock)>,
        open: Vec<(Ino, u32)>,
    },
}

/// The answers a client may keep ([`MetanodeReply::Held`]).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum HeldReply {
    Attr(Attr),
    Count(u64),
    /// The attributes and the encoded access ACL.
    Protection(Attr, Option<Vec<u8>>),
    /// `Find` found no such name.
    Absent,
    /// What `Make` made: its attributes, the bytes it holds and, for a regular file, its
    /// view (empty and inline: the write that follows a create asks for no view) and
    /// whether the client keeps the data token it asked for (`NewNode::keep_data`).
    Made(Attr, u64, Option<FileView>, bool),
    /// An answer to `AttrBytes`.
    AttrBytes(Attr, u64),
    /// What `Find` found: its attributes and the bytes it holds, under its own token (a
    /// `stat` after a lookup asks nothing more), and whether the name is kept too (under
    /// the directory's token: not granted while other nodes change the directory).
    Found {
        attr: Attr,
        bytes: u64,
        name: bool,
    },
    /// `Find` found the name naming an inode another owner slot serves (a directory made
    /// for it): the name is kept, the attributes asked of that slot's owner.
    Elsewhere(Ino),
}

/// An [`FsError`] on the wire: the variants a client acts on keep their identity (the
/// errno the application sees and what the client's own logic matches on); the others
/// travel as their errno and message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum RemoteError {
    NotFound,
    Exists,
    NotDir,
    IsDir,
    NotEmpty,
    Invalid(String),
    NameTooLong,
    NotSupported(String),
    NoXattr,
    Range {
        size: u32,
    },
    TooManyLinks,
    FileTooLarge,
    NoSpace {
        pool: String,
        what: AllocPurpose,
    },
    NoInodes {
        max: u64,
    },
    Checksum {
        nsd: String,
        offset: u64,
        ino: u64,
    },
    Corrupt(String),
    Fenced,
    ReadOnly,
    PermissionDenied,
    NotPermitted(String),
    /// Any other error of the metanode: its errno and message.
    Other {
        errno: i32,
        message: String,
    },
    ShardElsewhere {
        shard: u32,
    },
    InodeElsewhere {
        ino: u64,
    },
    /// The operation names what different owners serve: the client takes it in steps
    /// (`across_owners.rs`).
    AcrossOwners(String),
    /// Built on what another owner gave (`FsError::OwnerMoved`): done again from the start.
    OwnerMoved,
}

impl From<&FsError> for RemoteError {
    fn from(e: &FsError) -> RemoteError {
        match e {
            FsError::NotFound => RemoteError::NotFound,
            FsError::Exists => RemoteError::Exists,
            FsError::NotDir => RemoteError::NotDir,
            FsError::IsDir => RemoteError::IsDir,
            FsError::NotEmpty => RemoteError::NotEmpty,
            FsError::Invalid(s) => RemoteError::Invalid(s.clone()),
            FsError::NameTooLong => RemoteError::NameTooLong,
            FsError::NotSupported(s) => RemoteError::NotSupported(s.clone()),
            FsError::NoXattr => RemoteError::NoXattr,
            FsError::Range { size } => RemoteError::Range {
                size: u32::try_from(*size).unwrap_or(u32::MAX),
            },
            FsError::TooManyLinks => RemoteError::TooManyLinks,
            FsError::FileTooLarge => RemoteError::FileTooLarge,
            FsError::NoSpace { pool, what } => RemoteError::NoSpace {
                pool: pool.clone(),
                what: AllocPurpose::of(what),
            },
            FsError::NoInodes { max } => RemoteError::NoInodes { max: *max },
            FsError::Checksum { nsd, offset, ino } => RemoteError::Checksum {
                nsd: nsd.clone(),
                offset: *offset,
                ino: *ino,
            },
            FsError::Corrupt(s) => RemoteError::Corrupt(s.clone()),
            FsError::Fenced => RemoteError::Fenced,
            FsError::ReadOnly => RemoteError::ReadOnly,
            FsError::PermissionDenied => RemoteError::PermissionDenied,
            FsError::NotPermitted(s) => RemoteError::NotPermitted(s.clone()),
            FsError::ShardElsewhere { shard } => RemoteError::ShardElsewhere { shard: *shard },
            FsError::InodeElsewhere { ino } => RemoteError::InodeElsewhere { ino: *ino },
            FsError::AcrossOwners(s) => RemoteError::AcrossOwners(s.clone()),
            FsError::OwnerMoved => RemoteError::OwnerMoved,
            other => RemoteError::Other {
                errno: other.errno(),
                message: other.to_string(),
            },
        }
    }
}

impl From<RemoteError> for FsError {
    fn from(e: RemoteError) -> FsError {
        match e {
            RemoteError::NotFound => FsError::NotFound,
            RemoteError::Exists => FsError::Exists,
            RemoteError::NotDir => FsError::NotDir,
            RemoteError::IsDir => FsError::IsDir,
            RemoteError::NotEmpty => FsError::NotEmpty,
            RemoteError::Invalid(s) => FsError::Invalid(s),
            RemoteError::NameTooLong => FsError::NameTooLong,
            RemoteError::NotSupported(s) => FsError::NotSupported(s),
            RemoteError::NoXattr => FsError::NoXattr,
            RemoteError::Range { size } => FsError::Range {
                size: size as usize,
            },
            RemoteError::TooManyLinks => FsError::TooManyLinks,
            RemoteError::FileTooLarge => FsError::FileTooLarge,
            RemoteError::NoSpace { pool, what } => FsError::NoSpace {
                pool,
                what: what.label(),
            },
            RemoteError::NoInodes { max } => FsError::NoInodes { max },
            RemoteError::Checksum { nsd, offset, ino } => FsError::Checksum { nsd, offset, ino },
            RemoteError::Corrupt(s) => FsError::Corrupt(s),
            RemoteError::Fenced => FsError::Fenced,
            RemoteError::ReadOnly => FsError::ReadOnly,
            RemoteError::PermissionDenied => FsError::PermissionDenied,
            RemoteError::NotPermitted(s) => FsError::NotPermitted(s),
            RemoteError::Other { errno, message } => FsError::Remote { errno, message },
            RemoteError::ShardElsewhere { shard } => FsError::ShardElsewhere { shard },
            RemoteError::InodeElsewhere { ino } => FsError::InodeElsewhere { ino },
            RemoteError::AcrossOwners(s) => FsError::AcrossOwners(s),
            RemoteError::OwnerMoved => FsError::OwnerMoved,
        }
    }
}

/// The request of a node, mounting again, that the node which took over an owner slot
/// made for it give the slot back ([`MetanodeRequest::GiveSlotBack`]); the daemons of both
/// ends handle it, answered as a fence is ([`Fence::done`], [`Fence::check`]).
pub struct SlotHandBack;

impl SlotHandBack {
    pub fn request() -> Vec<u8> {
        encode(&MetanodeRequest::GiveSlotBack)
    }

    pub fn is_request(request: &[u8]) -> bool {
        matches!(
            decode::<MetanodeRequest>(request, "request"),
            Ok(MetanodeRequest::GiveSlotBack)
        )
    }
}

/// Asks the file system manager behind `channel` for an owner slot of this node's own
/// (`FileSystem::provide_slot`), before this node mounts it with `FileSystem::mount_slot`.
pub fn ask_for_slot(channel: &dyn MetanodeChannel) -> FsResult<u32> {
    let slot = ask_for_number(channel, MetanodeRequest::ProvideSlot, "an owner slot")?;
    u32::try_from(slot).map_err(|_| FsError::Invalid(format!("owner slot {slot} is out of range")))
}

fn region_number(r: u64) -> FsResult<usize> {
    usize::try_from(r)
        .map_err(|_| FsError::Invalid(format!("allocation region {r} is out of range")))
}

/// The number the owner behind `channel` answers `request` with (a slot or region the
/// file system manager gave, a region a slot gave back).
fn ask_for_number(
    channel: &dyn MetanodeChannel,
    request: MetanodeRequest,
    what: &str,
) -> FsResult<u64> {
    let reply: MetanodeReply = decode(&channel.call(encode(&request))?, "reply")?;
    match reply {
        MetanodeReply::Count(n) => Ok(n),
        MetanodeReply::Failed(e) => Err(e.into()),
        other => Err(FsError::Invalid(format!(
            "a metanode answered a request for {what} with {other:?}"
        ))),
    }
}

/// Encodes a request or a reply.
pub fn encode<T: Serialize>(message: &T) -> Vec<u8> {
    postcard::to_allocvec(message).expect("metanode messages always encode")
}

/// Decodes a request or a reply, refusing trailing bytes and oversized input: a message
/// that does not decode exactly is a broken or hostile peer, named in the error.
pub fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8], what: &str) -> FsResult<T> {
    if bytes.len() > MESSAGE_BYTES_MAX {
        return Err(FsError::Invalid(format!(
            "metanode {what} of {} bytes exceeds the {MESSAGE_BYTES_MAX}-byte limit",
            bytes.len()
        )));
    }
    let (message, rest) = postcard::take_from_bytes(bytes).map_err(|e| {
        FsError::Invalid(format!(
            "malformed metanode {what} ({} bytes): {e}",
            bytes.len()
        ))
    })?;
    if !rest.is_empty() {
        return Err(FsError::Invalid(format!(
            "metanode {what} has {} bytes after its end",
            rest.len()
        )));
    }
    Ok(message)
}

fn answer<T>(r: FsResult<T>, ok: impl FnOnce(T) -> MetanodeReply) -> MetanodeReply {
    match r {
        Ok(v) => ok(v),
        Err(e) => MetanodeReply::Failed(RemoteError::from(&e)),
    }
}

/// Answers one request from `owner`, the metanode of the inodes it names.
pub(crate) fn serve<O>(owner: &O, request: MetanodeRequest) -> MetanodeReply
where
    O: Metanode + Namespace + BlockAllocator + ?Sized,
{
    use MetanodeReply as R;
    use MetanodeRequest as Q;
    match request {
        Q::View { ino, blocks } => answer(owner.view(ino, blocks), R::View),
        Q::Update { ino, update } => answer(owner.update(ino, update), R::Lsn),
        Q::Commit { lsn } => answer(owner.commit(lsn), |()| R::Done),
        Q::CommitData { lsn, disks } => answer(owner.commit_data(lsn, &disks), |()| R::Done),
        Q::Accessed { ino } => {
            owner.accessed(ino);
            R::Done
        }
        Q::Allocate {
            pool,
            sub_blocks,
            hint,
            what,
        } => answer(
            owner.allocate(pool, sub_blocks, hint, what.label()),
            R::Extent,
        ),
        Q::AllocateCopies {
            pool,
            sub_blocks,
            hint,
            copies,
            what,
        } => answer(
            owner.allocate_copies(pool, sub_blocks, hint, copies, what.label()),
            R::Extents,
        ),
        Q::Abandon { extent } => {
            owner.abandon(extent);
            R::Done
        }
        Q::AllocateFragments {
            pool,
            sub_blocks,
            count,
            what,
        } => answer(
            owner.allocate_fragments(
                pool,
                sub_blocks,
                count.min(FRAGMENTS_ASKED_MAX),
                what.label(),
            ),
            R::Extents,
        ),
        Q::Attr { ino } => answer(owner.attr(ino), R::Attr),
        Q::HeldBytes { ino } => answer(owner.held_bytes(ino), R::Count),
        Q::AttrBytes { ino } => answer(
            owner
                .attr(ino)
                .and_then(|a| Ok((a, owner.held_bytes(ino)?))),
            |(a, bytes)| R::AttrBytes(a, bytes),
        ),
        Q::Find { parent, name } => answer(owner.find(parent, &name), R::Attr),
        Q::Make { parent, name, node } => answer(owner.make(parent, &name, node), R::Attr),
        Q::LinkTarget { ino } => answer(owner.link_target(ino), R::Bytes),
        Q::DropName { parent, name, dir } => {
            answer(owner.drop_name(parent, &name, dir), |()| R::Done)
        }
        Q::SealDir { ino, named_in } => answer(owner.seal_dir(ino, named_in), |()| R::Done),
        Q::DropEntryOf { parent, name, ino } => {
            answer(owner.drop_entry_of(parent, &name, ino), |()| R::Done)
        }
        Q::DropSealedDir { ino } => answer(owner.drop_sealed_dir(ino), |()| R::Done),
        Q::PutEntry {
            dir,
            name,
            ino,
            kind,
            replace,
        } => answer(owner.put_entry(dir, &name, (ino, kind), replace), |()| {
            R::Done
        }),
        Q::TakeEntry { dir, name, ino } => answer(owner.take_entry(dir, &name, ino), |()| R::Done),
        Q::CountLink { ino, up } => answer(owner.count_link(ino, up), |()| R::Done),
        Q::Reparent { dir, from, to } => answer(owner.reparent(dir, from, to), |()| R::Done),
        Q::DiskFree => answer(owner.disk_free(), R::DiskFree),
        Q::RestripeBatch {
            mode,
            shard,
            cursor,
        } => answer(owner.restripe_batch(mode, shard, &cursor), R::Restriped),
        Q::FilePool { ino } => answer(owner.file_pool(ino), |p| R::Count(u64::from(p))),
        Q::MigrateFile {
            ino,
            pool,
            move_data,
        } => answer(owner.migrate_file(ino, pool, move_data), R::Count),
        Q::MovePagesOff { budget } => answer(owner.move_pages_off(budget), R::Count),
        Q::DropDisks { disks } => answer(owner.drop_disks(&disks), |()| R::Done),
        Q::HoldMapWrites { hold, id } => answer(owner.hold_map_writes(hold, id), |()| R::Done),
        Q::MoveSlotRegion { to, give_up } => {
            answer(owner.move_slot_region(&to, give_up), |moved| {
                R::Count(u64::from(moved))
            })
        }
        Q::RecordSlotLog {
            slot,
            log_id,
            behind,
        } => answer(owner.record_slot_log(slot, log_id, behind), |()| R::Done),
        Q::RestoreCopies { rewrite } => {
            answer(owner.restore_copies(rewrite), |(checked, repaired)| {
                R::Restriped(crate::restripe::RestripeBatch {
                    scanned: checked,
                    changed: repaired,
                    ..Default::default()
                })
            })
        }
        // Answered by `FileSystem::serve_metanode_request_from`, which knows the manager.
        Q::ProvideSlot => R::Failed(RemoteError::NotSupported(
            "making an owner slot through this path".into(),
        )),
        Q::ProvideRegion { .. } => R::Failed(RemoteError::NotSupported(
            "giving an allocation region through this path".into(),
        )),
        Q::GiveSlotBack => R::Failed(RemoteError::NotSupported(
            "giving an owner slot back is the daemon's, not a mount's".into(),
        )),
        Q::GiveRegionBack => R::Failed(RemoteError::NotSupported(
            "giving an allocation region back through this path".into(),
        )),
        // Answered by `FileSystem::serve_metanode_request_from`, which knows the node.
        Q::Gather { .. } => R::Count(0),
        Q::AddName { ino, parent, name } => answer(owner.add_name(ino, parent, &name), R::Attr),
        Q::MoveName { from, to, how } => answer(
            owner.move_name((from.0, &from.1), (to.0, &to.1), how),
            |()| R::Done,
        ),
        Q::ChangeAttr { ino, set } => answer(owner.change_attr(ino, set), R::Attr),
        Q::Opened { ino } => answer(owner.opened(ino), R::Attr),
        Q::Closed { ino } => answer(owner.closed(ino), |()| R::Done),
        Q::Entries { ino, after } => answer(owner.entries(ino, after), R::Listing),
        Q::Space => R::Space(owner.space()),
        Q::PutXattr {
            ino,
            name,
            value,
            how,
        } => answer(owner.put_xattr(ino, &name, &value, how), |()| R::Done),
        Q::Xattr { ino, name } => answer(owner.xattr(ino, &name), R::Bytes),
        Q::XattrNames { ino } => answer(owner.xattr_names(ino), R::Bytes),
        Q::DropXattr { ino, name } => answer(owner.drop_xattr(ino, &name), |()| R::Done),
        Q::PutAcl {
            ino,
            kind,
            value,
            how,
            drop_setgid,
        } => answer(owner.put_acl(ino, kind, &value, how, drop_setgid), |()| {
            R::Done
        }),
        Q::Protection { ino } => answer(owner.protection(ino), |p| {
            R::Protection(p.attr, p.acl.map(|a| a.encode()))
        }),
        Q::Lock { ino, call } => answer(owner.lock(ino, call, None), R::Lock),
        Q::DropKept { holder, inos } => answer(owner.drop_kept(holder, &inos, None), |()| R::Done),
        Q::Once { request, .. } if matches!(*request, Q::Once { .. }) => {
            R::Failed(RemoteError::from(&FsError::Invalid(
                "a request inside a request inside Once".into(),
            )))
        }
        // Without the owner's record of answered requests (the loopback of tests): done.
        Q::Once { request, .. } => serve(owner, *request),
        Q::FenceWrites { .. } | Q::FenceSettled { .. } => {
            R::Failed(RemoteError::from(&FsError::Invalid(
                "a fence of client writes was sent to the node that owns the metadata; only \
                 clients are fenced"
                    .into(),
            )))
        }
        // The owner's own mount holds no views to drop (a took-over node's client mount
        // answers these itself).
        Q::DropHeld { .. }
        | Q::GiveBackData { .. }
        | Q::Leaving
        | Q::DescriptorChanged
        | Q::DiskAvailability { .. } => R::Done,
    }
}

/// What a request from another node's client changes that this node's kernel may cache
/// (attributes and pages of an inode, a name or the absence of one in a directory): the
/// owner's own mount keeps the kernel's caches, so whatever another node changes through
/// it must be dropped from them (see [`crate::FileSystem::on_remote_change`]). `child`
/// resolves a name to the inode it names before the request runs (an unlink or a rename
/// over it changes that inode's link count). Requests that change nothing cached (views,
/// reads of attributes, allocation, commits, opens, an access time) give nothing.
pub(crate) fn cache_changes(
    request: &MetanodeRequest,
    child: &dyn Fn(Ino, &[u8]) -> Option<Ino>,
) -> Vec<CacheChange> {
    use CacheChange::{Entry, Inode};
    use MetanodeRequest as Q;
    let entry = |parent: Ino, name: &[u8]| Entry {
        parent,
        name: name.to_vec(),
    };
    match request {
        Q::Once { request, .. } => cache_changes(request, child),
        Q::Update { ino, .. }
        | Q::ChangeAttr { ino, .. }
        | Q::PutXattr { ino, .. }
        | Q::DropXattr { ino, .. }
        | Q::PutAcl { ino, .. } => vec![Inode(*ino)],
        Q::Make { parent, name, .. } => vec![entry(*parent, name), Inode(*parent)],
        Q::AddName { ino, parent, name } => {
            vec![entry(*parent, name), Inode(*parent), Inode(*ino)]
        }
        Q::DropName { parent, name, .. } => {
            let mut changes = vec![entry(*parent, name), Inode(*parent)];
            changes.extend(child(*parent, name).map(Inode));
            changes
        }
        Q::DropEntryOf { parent, name, .. } => vec![entry(*parent, name), Inode(*parent)],
        Q::DropSealedDir { ino } | Q::CountLink { ino, .. } | Q::Reparent { dir: ino, .. } => {
            vec![Inode(*ino)]
        }
        Q::PutEntry { dir, name, .. } => {
            let mut changes = vec![entry(*dir, name), Inode(*dir)];
            changes.extend(child(*dir, name).map(Inode));
            changes
        }
        Q::TakeEntry { dir, name, .. } => vec![entry(*dir, name), Inode(*dir)],
        Q::MoveName { from, to, .. } => {
            let mut changes = vec![
                entry(from.0, &from.1),
                entry(to.0, &to.1),
                Inode(from.0),
                Inode(to.0),
            ];
            changes.extend(child(from.0, &from.1).map(Inode));
            changes.extend(child(to.0, &to.1).map(Inode));
            changes
        }
        Q::View { .. }
        | Q::Commit { .. }
        | Q::CommitData { .. }
        | Q::Accessed { .. }
        | Q::Allocate { .. }
        | Q::AllocateCopies { .. }
        | Q::AllocateFragments { .. }
        | Q::DropKept { .. }
        | Q::Abandon { .. }
        | Q::Attr { .. }
        | Q::HeldBytes { .. }
        | Q::AttrBytes { .. }
        | Q::Find { .. }
        | Q::LinkTarget { .. }
        | Q::Opened { .. }
        | Q::Closed { .. }
        | Q::Entries { .. }
        | Q::Space
        | Q::Xattr { .. }
        | Q::XattrNames { .. }
        | Q::Protection { .. }
        | Q::FenceWrites { .. }
        | Q::FenceSettled { .. }
        | Q::Lock { .. }
        | Q::DropHeld { .. }
        | Q::GiveBackData { .. }
        | Q::SealDir { .. }
        | Q::ProvideSlot
        | Q::ProvideRegion { .. }
        | Q::GiveSlotBack
        | Q::GiveRegionBack
        | Q::Gather { .. }
        | Q::DiskFree
        | Q::RestripeBatch { .. }
        | Q::FilePool { .. }
        | Q::MigrateFile { .. }
        | Q::MovePagesOff { .. }
        | Q::DropDisks { .. }
        | Q::HoldMapWrites { .. }
        | Q::MoveSlotRegion { .. }
        | Q::RecordSlotLog { .. }
        | Q::RestoreCopies { .. }
        | Q::Leaving
        | Q::DescriptorChanged
        | Q::DiskAvailability { .. } => Vec::new(),
    }
}

/// The answer to a namespace change that was done already (a retry of a
/// [`MetanodeRequest::Once`]): what the first run answered, as far as the namespace still
/// says it (the attributes of the name a create or link made).
pub(crate) fn answer_again<O>(owner: &O, request: &MetanodeRequest) -> MetanodeReply
where
    O: Namespace + ?Sized,
{
    use MetanodeRequest as Q;
    match request {
        Q::Make { parent, name, .. } | Q::AddName { parent, name, .. } => {
            answer(owner.find(*parent, name), MetanodeReply::Attr)
        }
        _ => MetanodeReply::Done,
    }
}

/// Whether the owner makes `request`'s change durable before it answers another node's
/// client: a change of the namespace or of attributes. Were the owner to die after
/// answering and before its next commit, the client would carry on from a state the new
/// owner never sees (a file it created and now writes would be gone: ENOENT in the middle
/// of an application's create, write, fsync). A data update needs no such commit: the
/// client commits it when the application asks (fsync, O_SYNC), as on one node, and until
/// then losing it with the owner loses only unsynced data.
pub(crate) fn durable_before_answer(request: &MetanodeRequest) -> bool {
    use MetanodeRequest as Q;
    if let Q::Once { request, .. } = request {
        return durable_before_answer(request);
    }
    matches!(
        request,
        Q::Make { .. }
            | Q::AddName { .. }
            | Q::DropName { .. }
            | Q::DropEntryOf { .. }
            | Q::DropSealedDir { .. }
            | Q::PutEntry { .. }
            | Q::TakeEntry { .. }
            | Q::CountLink { .. }
            | Q::Reparent { .. }
            | Q::MoveName { .. }
            | Q::ChangeAttr { .. }
            | Q::PutXattr { .. }
            | Q::DropXattr { .. }
            | Q::PutAcl { .. }
    )
}

/// Something a kernel cache on the owner's node may hold that another node's request
/// changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheChange {
    /// The inode's attributes, and its pages if a regular file.
    Inode(Ino),
    /// A name in a directory: present now, or gone.
    Entry { parent: Ino, name: Vec<u8> },
    /// Every name the kernel keeps (`FUSE_NOTIFY_INC_EPOCH`): dropped without waiting for
    /// any directory's lock, which a request of this node's own may hold while it waits
    /// for the owner that waits for this drop.
    AllNames,
}

/// Moves an encoded request to a metanode and brings back its encoded reply.
pub trait MetanodeChannel: Send + Sync {
    fn call(&self, request: Vec<u8>) -> FsResult<Vec<u8>>;

    /// Changes whenever the channel starts sending to another owner (the old one died
    /// and the file system was taken over): log positions and changes not yet durable
    /// at the old owner mean nothing to the new one.
    fn generation(&self) -> u64 {
        0
    }

    /// Like [`MetanodeChannel::call`], but only to the owner of generation `seen`: once
    /// the channel moved, [`FsError::OwnerMoved`] without sending. A channel that moves
    /// checks it with every attempt, atomically with the choice of where to send.
    fn call_seen(&self, request: Vec<u8>, seen: u64) -> FsResult<Vec<u8>> {
        if self.generation() != seen {
            return Err(FsError::OwnerMoved);
        }
        self.call(request)
    }

    /// Node `owner` in incarnation `incarnation` announced that it owns the metadata now
    /// (a fence): send there from now on.
    fn owner_announced(&self, _owner: u32, _incarnation: u64) {}

    /// Like [`MetanodeChannel::call`], but one attempt, to the owner the channel sends to
    /// now: no waiting for an owner that does not answer and no looking for another. For
    /// what a departing mount tells its owners as a courtesy (`Leaving`): an owner that is
    /// not served needs none of it, since whoever serves it next fences every client.
    fn call_once(&self, request: Vec<u8>) -> FsResult<Vec<u8>> {
        self.call(request)
    }
}

/// Unsynced updates a client keeps at most before it commits them itself.
const UNSYNCED_MAX: usize = 1024;

/// Blocks a sequential reader's view covers (`Metanode::view_to_read`): 32 MiB of 1 MiB
/// blocks, a reply of some 32 KiB of block references and sector checksums.
const READ_VIEW_BLOCKS: u64 = 32;
/// Files whose last read view a client remembers, at most (then it starts over).
const READ_VIEW_READERS: usize = 4096;

/// What a fenced client hands a new owner ([`MetanodeReply::ReplayChanges`]), in the
/// order the old owner acknowledged it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum HandedChange {
    /// A data update (as in [`MetanodeReply::Replay`]).
    Update { ino: Ino, update: FileUpdate },
    /// A namespace change the old owner answered before it was durable
    /// ([`MetanodeReply::Early`]): the `Once` request as sent, the end of its log record
    /// (lost if the new owner's open of the log did not reach it), and the inode a `Make`
    /// made, which the new owner makes again under the same number.
    Namespace {
        request: MetanodeRequest,
        lsn: Lsn,
        made: Option<Ino>,
    },
}

/// A client's updates that an owner acknowledged and the client does not know durable.
#[derive(Default)]
struct Unsynced {
    acked: std::collections::VecDeque<Acked>,
    /// The sequence number of the next update.
    next: u64,
}

struct Acked {
    seq: u64,
    /// Of the owner that acknowledged it ([`MetanodeChannel::generation`]); log
    /// positions mean something only to that owner.
    generation: u64,
    lsn: Lsn,
    change: HandedChange,
}

impl Unsynced {
    /// Keeps an acknowledged update or namespace change; returns how many are kept.
    fn push(&mut self, generation: u64, lsn: Lsn, change: HandedChange) -> usize {
        self.acked.push_back(Acked {
            seq: self.next,
            generation,
            lsn,
            change,
        });
        self.next += 1;
        self.acked.len()
    }
}

/// The client's end of the metanode interface over a channel.
pub(crate) struct RemoteMetanode {
    channel: Box<dyn MetanodeChannel>,
    /// The client's own handles of the disks: what it wrote through them must be on
    /// stable storage before the owner commits a log record that refers to it, and only
    /// the client can flush them (another node's flush covers its own queues only).
    disks: Arc<DiskSet>,
    /// Updates the owner acknowledged and this client does not know durable yet, kept to
    /// hand to a new owner when the old one dies (see [`RemoteMetanode::fence`]).
    unsynced: parking_lot::Mutex<Unsynced>,
    /// Held shared by every data write into space an owner gave or showed (see
    /// [`Metanode::write_seen`]), exclusively by a fence to wait for them.
    writes: parking_lot::RwLock<()>,
    /// Extents given out and not yet mapped or given back, with the generation of the
    /// owner that gave them: only that owner may be told what became of them.
    granted: parking_lot::Mutex<std::collections::HashMap<Extent, u64>>,
    /// This mount's name as a client (random) and its next request number (see
    /// [`MetanodeRequest::Once`]).
    client: u64,
    seq: std::sync::atomic::AtomicU64,
    /// What the owner let this client keep until it revokes it (`read_tokens.rs`).
    held: crate::read_tokens::HeldCache,
    /// Requests sent to the owner and the time spent waiting for their answers, by kind.
    sent: SentRequests,
    /// Where each file's last read view ended (`Metanode::view_to_read`).
    read_view_ends: parking_lot::Mutex<std::collections::HashMap<Ino, u64>>,
    /// Fragments the owner gave ahead for new small files, by pool and size, with the
    /// owner generation that gave them (see [`BlockAllocator::allocate_first_fragment`]).
    fragments: parking_lot::Mutex<FragmentReserve>,
    /// The mount is going: each request is one attempt to the owner the channel sends to
    /// now, not a wait for one that does not answer (see [`RemoteMetanode::leaving`]).
    going: std::sync::atomic::AtomicBool,
}

/// Fragments given ahead, by (pool, sub-blocks): each with its giver's generation.
type FragmentReserve = std::collections::HashMap<(PoolId, u32), Vec<(Extent, u64)>>;

/// Fragments a client asks for at once when its reserve of one size is empty: one round
/// trip per this many small files instead of one each. The owner holds them as given out
/// (`Meta::unlogged`, stored free by its checkpoints) until they are mapped or given back;
/// a client that dies leaves at most this many per size held until the owner's next mount.
const FRAGMENTS_AHEAD: u32 = 16;
/// The most sub-blocks a client keeps given ahead from one owner, all sizes together
/// (8 MiB at the usual 8 KiB sub-block): files of many sizes ask ahead for fewer of each,
/// down to one at a time, so what the reserve holds out of everyone's reach stays bounded.
const FRAGMENTS_AHEAD_SUB_BLOCKS: u64 = 1024;
/// How many fragments of `sub_blocks` to ask for when the reserve has none of that size:
/// [`FRAGMENTS_AHEAD`], fewer when the reserve would then hold more than
/// [`FRAGMENTS_AHEAD_SUB_BLOCKS`], at least the one needed now.
fn fragments_to_ask(reserve: &FragmentReserve, sub_blocks: u32) -> u32 {
    let held: u64 = reserve
        .iter()
        .map(|((_, size), kept)| u64::from(*size) * kept.len() as u64)
        .sum();
    let room = FRAGMENTS_AHEAD_SUB_BLOCKS.saturating_sub(held) / u64::from(sub_blocks.max(1));
    room.clamp(1, u64::from(FRAGMENTS_AHEAD)) as u32
}

/// The most fragments an owner gives in one answer, whatever it is asked.
pub(crate) const FRAGMENTS_ASKED_MAX: u32 = 64;

/// How many requests of each kind a mount sent to one owner, and the seconds it waited for
/// their answers (`FileSystem::metanode_requests`): where a client's time goes, to the
/// owner's log commits, to its revocations of other nodes, to the network.
#[derive(Default)]
pub(crate) struct SentRequests(
    parking_lot::Mutex<std::collections::BTreeMap<&'static str, (u64, u64)>>,
);

impl SentRequests {
    fn note(&self, kind: &'static str, started: std::time::Instant) {
        let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let mut sent = self.0.lock();
        let (count, total) = sent.entry(kind).or_default();
        *count += 1;
        *total = total.saturating_add(nanos);
    }

    /// (kind, requests, seconds waited) of every kind sent at least once.
    pub(crate) fn snapshot(&self) -> Vec<(&'static str, u64, f64)> {
        self.0
            .lock()
            .iter()
            .map(|(k, (n, ns))| (*k, *n, *ns as f64 / 1e9))
            .collect()
    }
}

impl RemoteMetanode {
    pub fn new(channel: Box<dyn MetanodeChannel>, disks: Arc<DiskSet>) -> RemoteMetanode {
        RemoteMetanode {
            client: random_client_id(),
            seq: std::sync::atomic::AtomicU64::new(1),
            channel,
            disks,
            unsynced: parking_lot::Mutex::new(Unsynced::default()),
            writes: parking_lot::RwLock::new(()),
            granted: parking_lot::Mutex::new(std::collections::HashMap::new()),
            held: crate::read_tokens::HeldCache::default(),
            sent: SentRequests::default(),
            read_view_ends: parking_lot::Mutex::new(std::collections::HashMap::new()),
            fragments: parking_lot::Mutex::new(std::collections::HashMap::new()),
            going: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// From now on every request makes one attempt ([`MetanodeChannel::call_once`]): the
    /// mount is unmounting, and an owner slot another node let go or lost meanwhile is named
    /// in the log, not waited for (nor taken over by a node that no longer mounts).
    pub(crate) fn leaving(&self) {
        self.going.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// What this mount sent to the owner, by kind (see [`SentRequests`]).
    pub(crate) fn sent(&self) -> Vec<(&'static str, u64, f64)> {
        self.sent.snapshot()
    }

    /// Whether updates this client sent are acknowledged but not known durable at the
    /// owner (namespace changes are durable before they are answered; data updates wait
    /// for a commit).
    pub(crate) fn has_unsynced(&self) -> bool {
        !self.unsynced.lock().acked.is_empty()
    }

    /// The owner revoked what this client holds of `inos`.
    /// Whether this client holds `name` in `parent` naming `ino`, under the read token of
    /// the owner it reaches now.
    pub(crate) fn holds_name(&self, parent: Ino, name: &[u8], ino: Ino) -> bool {
        let generation = self.channel.generation();
        self.held
            .get(parent, generation, |of| of.names.get(name).copied())
            == Some(Some(ino))
    }

    /// Whether this client holds `name` in `parent`, naming `ino`, under the name's own
    /// token (`read_tokens::name_key`) from the owner it reaches now.
    pub(crate) fn holds_named(&self, parent: Ino, name: &[u8], ino: Ino) -> bool {
        self.held_named(parent, name, self.channel.generation()) == Some(ino)
    }

    /// The inode `name` in `parent` names, held under the name's own token from the
    /// owner of `generation`.
    fn held_named(&self, parent: Ino, name: &[u8], generation: u64) -> Option<Ino> {
        let key = crate::read_tokens::name_key(parent, name);
        self.held.get(key, generation, |of| {
            of.named
                .iter()
                .find(|(dir, n, _)| *dir == parent && n == name)
                .map(|(_, _, ino)| *ino)
        })
    }

    /// Keeps `name` in `parent`, naming `ino`, under the name's own token, which every
    /// `Found` and `Made` grants (`FileSystem::held_reply`).
    fn keep_named(&self, parent: Ino, name: &[u8], ino: Ino, generation: u64, seq: u64) {
        let key = crate::read_tokens::name_key(parent, name);
        self.held.keep(key, generation, seq, |of| {
            of.named
                .retain(|(dir, n, _)| !(*dir == parent && n == name));
            of.named.push((parent, name.to_vec(), ino));
        });
    }

    /// Whether this client holds `ino`'s attributes under the read token of the owner it
    /// reaches now.
    pub(crate) fn holds_attr(&self, ino: Ino) -> bool {
        let generation = self.channel.generation();
        self.held.get(ino, generation, |of| of.attr).is_some()
    }

    /// Drops everything this client holds from its owner (see `FileSystem::lease_lost`).
    pub(crate) fn drop_all_held(&self) {
        self.held.drop_all();
    }

    pub(crate) fn drop_held(&self, inos: &[Ino]) {
        self.held.drop_inos(inos);
    }

    /// A new owner's fence: the dead owner's log lost what it had not made durable, so
    /// space it gave out or showed mapped may be free in the new owner's eyes and go to
    /// another file. From here on this client sends to the new owner, every request built
    /// on what the old one said fails with [`FsError::OwnerMoved`] (the data path starts
    /// it again), and once the writes in flight under the old owner have landed (the
    /// exclusive lock waits for them) the new owner may give out space.
    ///
    /// The answer hands the new owner every update the old owners acknowledged that this
    /// client does not know durable, in order, once the data they refer to is on stable
    /// storage here: the new owner applies them before it serves, so that a takeover
    /// loses nothing a client wrote (GPFS's clients likewise resend their dirty metadata
    /// to a new metanode). They stay here until [`RemoteMetanode::fence_settled`] says the
    /// new owner made them durable (it may die first, and its successor needs them too).
    pub fn fence(&self, owner: u32, incarnation: u64) -> MetanodeReply {
        self.channel.owner_announced(owner, incarnation);
        drop(self.writes.write());
        let generation = self.channel.generation();
        // What the old owner gave out is nobody's to give back now.
        self.granted.lock().retain(|_, g| *g == generation);
        self.fragments.lock().clear();
        if let Err(e) = self.flush(self.every_disk()) {
            return MetanodeReply::Failed(RemoteError::from(&e));
        }
        // In the order the owners logged them: threads of this client keep what they were
        // answered in the order the answers came, and one may have built on another's
        // change whose answer was still on its way (a name found at the owner before its
        // creator kept its create).
        let mut acked: Vec<(u64, Lsn, HandedChange)> = self
            .unsynced
            .lock()
            .acked
            .iter()
            .filter(|a| a.generation != generation)
            .map(|a| (a.generation, a.lsn, a.change.clone()))
            .collect();
        acked.sort_by_key(|(generation, lsn, _)| (*generation, *lsn));
        let replay: Vec<HandedChange> = acked.into_iter().map(|(_, _, c)| c).collect();
        if replay.is_empty() {
            MetanodeReply::Done
        } else {
            MetanodeReply::ReplayChanges(replay)
        }
    }

    /// The end of a fence: the updates handed over were made durable by the new owner
    /// (`replayed`), so they are no longer this client's to keep; otherwise the next
    /// commit reports them lost.
    pub fn fence_settled(&self, replayed: bool) {
        if replayed {
            let generation = self.channel.generation();
            self.unsynced
                .lock()
                .acked
                .retain(|a| a.generation == generation);
        }
    }

    /// Sends a commit that makes durable the updates logged up to `lsn`, and says whether
    /// it covered every update acknowledged before it.
    fn commit_with(&self, request: MetanodeRequest, lsn: Lsn) -> FsResult<()> {
        let before = self.unsynced.lock().next;
        self.done(request)?;
        let generation = self.channel.generation();
        let mut unsynced = self.unsynced.lock();
        if unsynced.acked.iter().any(|a| a.generation != generation) {
            // Acknowledged by an owner that died, and not replayed by its successor.
            unsynced.acked.retain(|a| a.generation == generation);
            return Err(FsError::Io(std::io::Error::other(
                "the node that owned this file system's metadata died before these changes \
                 were durable, and the node that took it over could not apply them again: \
                 changes made since the last successful fsync may be lost; write them again",
            )));
        }
        unsynced.acked.retain(|a| !(a.seq < before && a.lsn <= lsn));
        Ok(())
    }

    /// Flushes `disks` but those that are down: a disk this mount took out (a write there
    /// failed, with copies elsewhere) holds nothing a commit waits for.
    fn flush(&self, disks: impl Iterator<Item = u16>) -> FsResult<()> {
        for disk in disks {
            if !self.disks.is_down(disk) {
                self.disks.get(disk).flush()?;
            }
        }
        Ok(())
    }

    fn every_disk(&self) -> impl Iterator<Item = u16> {
        0..self.disks.len() as u16
    }

    fn call(&self, request: MetanodeRequest) -> FsResult<MetanodeReply> {
        self.call_held(request)?.0
    }

    /// Asks the owner this mount reaches (the file system manager, for a slot's owner) for
    /// another allocation region for slot `slot`, whose regions are full
    /// (`FileSystem::provide_region`).
    pub(crate) fn ask_for_region(&self, slot: u32) -> FsResult<usize> {
        let started = std::time::Instant::now();
        let asked = MetanodeRequest::ProvideRegion { slot };
        let region = ask_for_number(self.channel.as_ref(), asked, "a region");
        self.sent.note("ProvideRegion", started);
        region_number(region?)
    }

    /// Asks the owner of the slot this way leads to for an allocation region it no longer
    /// uses (`FileSystem::give_region_back`), for the file system manager.
    pub(crate) fn ask_to_give_region_back(&self) -> FsResult<usize> {
        let started = std::time::Instant::now();
        let asked = MetanodeRequest::GiveRegionBack;
        let region = ask_for_number(self.channel.as_ref(), asked, "a region given back");
        self.sent.note("GiveRegionBack", started);
        region_number(region?)
    }

    /// Sends `request`; the answer (a failure of the request itself as the inner error)
    /// and, if the owner granted it to keep until it revokes it, the count of revocations
    /// and changes to keep it under ([`HeldCache::keep`]).
    fn call_held(
        &self,
        request: MetanodeRequest,
    ) -> FsResult<(FsResult<MetanodeReply>, Option<u64>)> {
        // The owner does not revoke what this client holds of what its own requests
        // change: it lists those inodes in the answer. Answers to requests sent before
        // this one are not kept (one may have been read before the change).
        let changes = changes_held(&request);
        let seq = if changes {
            self.held.bump()
        } else {
            self.held.seq()
        };
        let mut dirs: Vec<Ino> = parents_of(&request).iter().map(|(dir, _)| *dir).collect();
        dirs.sort_unstable();
        dirs.dedup();
        let ticket = self.held.take_off(&dirs);
        let encoded = encode(&request);
        let reply = loop {
            let generation = self.channel.generation();
            let started = std::time::Instant::now();
            let sent = if self.going.load(std::sync::atomic::Ordering::SeqCst) {
                self.channel.call_once(encoded.clone())
            } else {
                self.channel.call(encoded.clone())
            };
            self.sent.note(request.kind(), started);
            let bytes = match sent {
                Ok(bytes) => bytes,
                Err(e) => {
                    self.held.land(&ticket);
                    break Err(e);
                }
            };
            let Some((lsn, inner)) = early_answer(&bytes) else {
                break self.unwrap_reply(&bytes, Some(&request), Some((generation, seq)), &ticket);
            };
            // Kept for a new owner before it counts as done, under the lock a fence
            // collects them under: if the owner moved while the answer was on its way,
            // the fence did not take it, so it is asked again there (the same `Once`: done
            // once, whichever owner's log has it).
            let mut unsynced = self.unsynced.lock();
            if self.channel.generation() != generation {
                continue;
            }
            let reply = self.unwrap_reply(&inner, Some(&request), Some((generation, seq)), &ticket);
            let made = match (&request, &reply) {
                (
                    MetanodeRequest::Once { request: r, .. },
                    Ok((MetanodeReply::Made(a, ..) | MetanodeReply::Attr(a), _)),
                ) if matches!(**r, MetanodeRequest::Make { .. }) => Some(a.ino),
                _ => None,
            };
            let change = HandedChange::Namespace {
                request: request.clone(),
                lsn,
                made,
            };
            let many = unsynced.push(generation, lsn, change) > UNSYNCED_MAX;
            drop(unsynced);
            if many {
                // As for updates (`update_seen`): bounds what this client keeps.
                if let Err(e) = Metanode::commit(self, lsn) {
                    tracing::warn!("committing this client's unsynced changes: {e}");
                }
            }
            break reply;
        };
        // What this request's own answer dropped moved the count by one.
        let kept = |(held, dropped): (bool, bool)| held.then_some(seq + u64::from(dropped));
        match reply {
            Ok((MetanodeReply::Failed(e), held)) => Ok((Err(e.into()), kept(held))),
            Ok((reply, held)) => Ok((Ok(reply), kept(held))),
            Err(e) => {
                // Perhaps done, with an answer that never came: nothing says what changed.
                if changes {
                    self.held.drop_all();
                }
                Err(e)
            }
        }
    }

    /// Decodes an answer, drops what it says this client's request changed (but see
    /// [`HeldCache::drop_changed`] for `parents`, the directories whose names the request
    /// changed, and those names), and says whether what it carries may be kept and
    /// whether it dropped anything (moving the count by one). With `sent`, the owner
    /// generation and the count when the request went out, the fresh attributes the
    /// answer carries are kept (unless anything else moved the count).
    fn unwrap_reply(
        &self,
        bytes: &[u8],
        request: Option<&MetanodeRequest>,
        sent: Option<(u64, u64)>,
        ticket: &crate::read_tokens::FlightTicket,
    ) -> FsResult<(MetanodeReply, (bool, bool))> {
        let opened = match open_reply(bytes) {
            Ok(opened) => opened,
            Err(e) => {
                self.held.land(ticket);
                return Err(e);
            }
        };
        match &opened.changed {
            Some(Some(inos)) => {
                let parents = request.map(parents_of).unwrap_or_default();
                let after = request.and_then(|r| names_after(r, &opened.reply));
                self.held
                    .drop_changed(inos, &parents, after.as_deref(), ticket);
            }
            Some(None) => {
                self.held.land(ticket);
                self.held.drop_all();
            }
            None => {
                self.held.land(ticket);
            }
        }
        if let (Some((generation, seq)), Some(Some(_))) = (sent, &opened.changed) {
            for (attr, bytes) in &opened.fresh {
                self.held.keep(attr.ino, generation, seq + 1, |of| {
                    of.attr = Some(*attr);
                    of.held_bytes = Some(*bytes);
                });
            }
        }
        Ok((opened.reply, (opened.held, opened.changed.is_some())))
    }

    /// What a held `Protection` answer decodes to.
    fn protection_of(attr: Attr, acl: Option<Vec<u8>>) -> FsResult<Protection> {
        let acl = acl
            .map(|bytes| Acl::decode(&bytes))
            .transpose()
            .map_err(|e| FsError::Invalid(format!("metanode sent a malformed ACL: {e}")))?;
        Ok(Protection { attr, acl })
    }
}

/// An answer as the client reads it: what its request changed of what it holds (`Some`;
/// `Some(None)`: unknown, drop everything), the reply itself, and whether it may be kept.
struct OpenedReply {
    changed: Option<Option<Vec<Ino>>>,
    fresh: Vec<(Attr, u64)>,
    reply: MetanodeReply,
    held: bool,
}

/// The log position and the inner answer of an [`MetanodeReply::Early`] answer; `None`
/// for any other (or undecodable) answer, which the caller decodes as usual.
fn early_answer(bytes: &[u8]) -> Option<(Lsn, Vec<u8>)> {
    // Postcard begins an enum with its variant's index: only an answer that begins like
    // `Early` is decoded twice.
    static TAG: std::sync::LazyLock<u8> = std::sync::LazyLock::new(|| {
        encode(&MetanodeReply::Early {
            lsn: 0,
            reply: Vec::new(),
        })[0]
    });
    if bytes.first() != Some(&*TAG) {
        return None;
    }
    match decode::<MetanodeReply>(bytes, "reply") {
        Ok(MetanodeReply::Early { lsn, reply }) => Some((lsn, reply)),
        _ => None,
    }
}

/// Decodes an answer and takes `Changed` and `Held` apart. A change list inside a change
/// list is refused: it is no answer an owner gives.
fn open_reply(bytes: &[u8]) -> FsResult<OpenedReply> {
    let mut reply = decode::<MetanodeReply>(bytes, "reply")?;
    let mut changed = None;
    let mut fresh = Vec::new();
    if let MetanodeReply::Changed {
        inos,
        reply: inner,
        fresh: kept,
    } = reply
    {
        changed = Some(inos);
        fresh = kept;
        reply = decode::<MetanodeReply>(&inner, "reply")?;
        if matches!(reply, MetanodeReply::Changed { .. }) {
            return Err(FsError::Invalid(
                "metanode answered with a change list inside a change list".into(),
            ));
        }
    }
    let (reply, held) = match reply {
        MetanodeReply::Held(held) => (
            match held {
                HeldReply::Attr(a) => MetanodeReply::Attr(a),
                HeldReply::Count(n) => MetanodeReply::Count(n),
                HeldReply::Protection(a, acl) => MetanodeReply::Protection(a, acl),
                HeldReply::Absent => MetanodeReply::Failed(RemoteError::NotFound),
                HeldReply::Made(a, bytes, view, kept) => MetanodeReply::Made(a, bytes, view, kept),
                HeldReply::Found { attr, bytes, name } => MetanodeReply::Found(attr, bytes, name),
                HeldReply::AttrBytes(a, bytes) => MetanodeReply::AttrBytes(a, bytes),
                HeldReply::Elsewhere(ino) => {
                    MetanodeReply::Failed(RemoteError::InodeElsewhere { ino })
                }
            },
            true,
        ),
        reply => (reply, false),
    };
    Ok(OpenedReply {
        changed,
        fresh,
        reply,
        held,
    })
}

/// The names a namespace request changes, with their directories.
fn parents_of(request: &MetanodeRequest) -> Vec<(Ino, &[u8])> {
    use MetanodeRequest as Q;
    match request {
        Q::Once { request, .. } => parents_of(request),
        Q::Make { parent, name, .. }
        | Q::DropName { parent, name, .. }
        | Q::DropEntryOf { parent, name, .. }
        | Q::AddName { parent, name, .. }
        | Q::PutEntry {
            dir: parent, name, ..
        }
        | Q::TakeEntry {
            dir: parent, name, ..
        } => vec![(*parent, name.as_slice())],
        Q::MoveName { from, to, .. } => vec![(from.0, from.1.as_slice()), (to.0, to.1.as_slice())],
        _ => Vec::new(),
    }
}

/// What each name a namespace change of this client's changed became, as its answer says:
/// a made or linked name names its inode, an unlinked one is absent. `None` when the
/// answer does not say (a rename, which may replace or exchange; a failure).
fn names_after<'r>(
    request: &'r MetanodeRequest,
    reply: &MetanodeReply,
) -> Option<Vec<crate::read_tokens::NameAfter<'r>>> {
    use MetanodeRequest as Q;
    let made = match reply {
        MetanodeReply::Attr(a) | MetanodeReply::Made(a, _, _, _) => Some(a.ino),
        MetanodeReply::Done => None,
        _ => return None,
    };
    match (request, made) {
        (Q::Once { request, .. }, _) => names_after(request, reply),
        (Q::Make { parent, name, .. } | Q::AddName { parent, name, .. }, Some(ino)) => {
            Some(vec![(*parent, name.as_slice(), Some(ino))])
        }
        (Q::DropName { parent, name, .. } | Q::DropEntryOf { parent, name, .. }, None) => {
            Some(vec![(*parent, name.as_slice(), None)])
        }
        _ => None,
    }
}

/// Whether a request may change what a client holds of some inode: everything but reads,
/// locks, allocation and commits (which log no change to an inode).
fn changes_held(request: &MetanodeRequest) -> bool {
    use MetanodeRequest as Q;
    !matches!(
        request,
        Q::View { .. }
            | Q::Attr { .. }
            | Q::HeldBytes { .. }
            | Q::AttrBytes { .. }
            | Q::Find { .. }
            | Q::LinkTarget { .. }
            | Q::Entries { .. }
            | Q::Space
            | Q::DiskFree
            | Q::FilePool { .. }
            | Q::Xattr { .. }
            | Q::XattrNames { .. }
            | Q::Protection { .. }
            | Q::Lock { .. }
            | Q::DropKept { .. }
            | Q::ProvideRegion { .. }
            | Q::GiveSlotBack
            | Q::GiveRegionBack
            | Q::Allocate { .. }
            | Q::AllocateCopies { .. }
            | Q::AllocateFragments { .. }
            | Q::Abandon { .. }
    )
}

/// A reply of the wrong kind for its request: the peer is broken, not the file.
fn mismatch(reply: MetanodeReply, wanted: &str) -> FsError {
    FsError::Invalid(format!(
        "metanode answered with {reply:?} where {wanted} was due"
    ))
}

macro_rules! expect_reply {
    ($reply:expr, $pattern:pat => $value:expr, $wanted:literal) => {
        match $reply {
            $pattern => Ok($value),
            other => Err(mismatch(other, $wanted)),
        }
    };
}

/// A client's name for [`MetanodeRequest::Once`]: unique among the mounts an owner serves
/// (64 random bits from the clock, the process and a stack address, hashed).
pub(crate) fn random_client_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    let local = 0u8;
    h.write_usize(std::ptr::addr_of!(local) as usize);
    h.finish()
}

impl RemoteMetanode {
    /// `request` as the next request of this client that must be done once.
    fn once(&self, request: MetanodeRequest) -> MetanodeRequest {
        let seq = self.seq.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        MetanodeRequest::Once {
            client: self.client,
            seq,
            request: Box::new(request),
        }
    }

    fn done(&self, request: MetanodeRequest) -> FsResult<()> {
        expect_reply!(self.call(request)?, MetanodeReply::Done => (), "done")
    }

    /// Tells the owner this mount is going (`MetanodeRequest::Leaving`); best effort: an
    /// owner that does not hear it revokes what the node held one change at a time, as
    /// before.
    pub(crate) fn leave(&self) {
        self.give_back_fragments();
        // Once: an owner unmounting at the same time (`umount -a`) is not waited for.
        let told = self
            .channel
            .call_once(encode(&MetanodeRequest::Leaving))
            .and_then(|reply| match decode::<MetanodeReply>(&reply, "reply")? {
                MetanodeReply::Done => Ok(()),
                MetanodeReply::Failed(e) => Err(e.into()),
                other => Err(FsError::Invalid(format!(
                    "a metanode answered Leaving with {other:?}"
                ))),
            });
        if let Err(e) = told {
            tracing::info!("telling the owner this mount is going: {e}");
        }
    }

    /// Gives back the fragments the owner gave ahead and this mount did not use.
    pub(crate) fn give_back_fragments(&self) {
        let kept: Vec<Extent> = self
            .fragments
            .lock()
            .drain()
            .flat_map(|(_, v)| v.into_iter().map(|(e, _)| e))
            .collect();
        for extent in kept {
            BlockAllocator::abandon(self, extent);
        }
    }

    fn attr_of(&self, request: MetanodeRequest) -> FsResult<Attr> {
        expect_reply!(self.call(request)?, MetanodeReply::Attr(a) => a, "attributes")
    }

    fn bytes(&self, request: MetanodeRequest) -> FsResult<Vec<u8>> {
        expect_reply!(self.call(request)?, MetanodeReply::Bytes(b) => b, "bytes")
    }
}

impl Metanode for RemoteMetanode {
    fn view(&self, ino: Ino, blocks: Range<u64>) -> FsResult<FileView> {
        let generation = self.channel.generation();
        if let Some(view) = self.held.view(ino, &blocks, generation) {
            return Ok(view);
        }
        let seq = self.held.seq();
        let reply = self.call(MetanodeRequest::View {
            ino,
            blocks: blocks.clone(),
        })?;
        match reply {
            MetanodeReply::View(v) => Ok(v),
            MetanodeReply::HeldView(v) => {
                self.held.keep_view(ino, &blocks, generation, seq, &v);
                Ok(v)
            }
            other => Err(mismatch(other, "a view")),
        }
    }

    fn view_to_read(&self, ino: Ino, blocks: Range<u64>) -> FsResult<FileView> {
        let generation = self.channel.generation();
        if let Some(view) = self.held.view(ino, &blocks, generation) {
            return Ok(view);
        }
        // A reader that goes on where its last view ended is asked a view of the blocks
        // it reaches next too, kept under the inode's token: one round trip for the reads
        // of `READ_VIEW_BLOCKS` blocks, not one per read (a random reader asks what it
        // reads, so its answers stay small).
        let sequential = {
            let mut ends = self.read_view_ends.lock();
            if ends.len() >= READ_VIEW_READERS {
                ends.clear();
            }
            let near = ends
                .get(&ino)
                .is_some_and(|end| blocks.start + 1 >= *end && blocks.start <= *end + 1);
            ends.insert(ino, blocks.end);
            near
        };
        if !sequential || blocks.is_empty() {
            return self.view(ino, blocks);
        }
        let wide = blocks.start
            ..blocks
                .end
                .max(blocks.start.saturating_add(READ_VIEW_BLOCKS));
        let seq = self.held.seq();
        let reply = self.call(MetanodeRequest::View {
            ino,
            blocks: wide.clone(),
        })?;
        let view = match reply {
            MetanodeReply::View(v) => v,
            MetanodeReply::HeldView(v) => {
                self.held.keep_view(ino, &wide, generation, seq, &v);
                self.read_view_ends.lock().insert(ino, wide.end);
                v
            }
            other => return Err(mismatch(other, "a view")),
        };
        Ok(view.within(&blocks))
    }

    fn update(&self, ino: Ino, update: FileUpdate) -> FsResult<Lsn> {
        let seen = self.channel.generation();
        self.update_seen(ino, update, seen)
    }

    fn generation(&self) -> u64 {
        self.channel.generation()
    }

    fn update_seen(&self, ino: Ino, update: FileUpdate, seen: u64) -> FsResult<Lsn> {
        let mapped: Vec<Extent> = update
            .changes
            .iter()
            .filter_map(Change::mapped_block)
            .flat_map(|(_, _, block)| block.extents())
            .collect();
        // Space given out by an owner that is gone is nobody's to map.
        if mapped
            .iter()
            .any(|e| self.granted.lock().get(e).is_some_and(|g| *g != seen))
        {
            return Err(FsError::OwnerMoved);
        }
        let kept = update.clone();
        let request = encode(&MetanodeRequest::Update { ino, update });
        // Not revoked by the owner (its own change): dropped here, and again with
        // whatever else the answer lists, which keeps the attributes the change left (a
        // `stat` of the file just written asks nothing). An answer that lists nothing is
        // from an owner that records nothing of this client's: dropped again, in case an
        // answer read before the change was kept meanwhile.
        self.held.drop_inos(&[ino]);
        let seq = self.held.seq();
        let started = std::time::Instant::now();
        let reply = self.channel.call_seen(request, seen);
        self.sent.note("Update", started);
        let (reply, (_, listed)) =
            self.unwrap_reply(&reply?, None, Some((seen, seq)), &Vec::new())?;
        if !listed {
            self.held.drop_inos(&[ino]);
        }
        let lsn = match reply {
            MetanodeReply::Lsn(l) => l,
            MetanodeReply::Failed(e) => return Err(e.into()),
            other => return Err(mismatch(other, "a log position")),
        };
        let mut granted = self.granted.lock();
        for e in &mapped {
            granted.remove(e);
        }
        drop(granted);
        let mut unsynced = self.unsynced.lock();
        if self.channel.generation() != seen {
            // Answered by an owner that another replaced while the answer was on its way:
            // the fence collected this client's acknowledged updates before this one was
            // among them, so the new owner never heard of it. Done again from the start
            // (the write plans anew at the new owner), never reported done. Checked under
            // the lock the fence reads them under, after it moved the channel.
            return Err(FsError::OwnerMoved);
        }
        let many =
            unsynced.push(seen, lsn, HandedChange::Update { ino, update: kept }) > UNSYNCED_MAX;
        drop(unsynced);
        if many {
            // Bounds what a fence hands over and what this client holds: the owner's own
            // group commits make them durable without telling it. A failure is the next
            // fsync's to report; this update was acknowledged.
            if let Err(e) = self.commit(lsn) {
                tracing::warn!("committing this client's unsynced updates: {e}");
            }
        }
        Ok(lsn)
    }

    fn write_seen(
        &self,
        seen: u64,
        write: &mut dyn FnMut() -> std::io::Result<()>,
    ) -> FsResult<()> {
        let _in_flight = self.writes.read();
        if self.channel.generation() != seen {
            return Err(FsError::OwnerMoved);
        }
        write()?;
        Ok(())
    }

    fn commit(&self, lsn: Lsn) -> FsResult<()> {
        self.flush(self.every_disk())?;
        self.commit_with(MetanodeRequest::Commit { lsn }, lsn)
    }

    fn commit_data(&self, lsn: Lsn, disks: &[u16]) -> FsResult<()> {
        self.flush(disks.iter().copied())?;
        // The owner has nothing of this write's data to flush: only its log record.
        self.commit_with(
            MetanodeRequest::CommitData {
                lsn,
                disks: Vec::new(),
            },
            lsn,
        )
    }

    fn accessed(&self, ino: Ino) {
        if let Err(e) = self.done(MetanodeRequest::Accessed { ino }) {
            tracing::warn!("atime update of inode {ino}: {e}");
        }
        // Attributes kept with the old access time would ask for this again at every read.
        self.held.drop_inos(&[ino]);
    }
}

impl BlockAllocator for RemoteMetanode {
    fn allocate(
        &self,
        pool: PoolId,
        sub_blocks: u32,
        hint: BlockHint,
        what: &'static str,
    ) -> FsResult<Extent> {
        // Taken before the call: if the owner moves during it, the extent is counted as
        // the old owner's, which at worst leaks it until the next mount's scan.
        let seen = self.channel.generation();
        let reply = self.call(MetanodeRequest::Allocate {
            pool,
            sub_blocks,
            hint,
            what: AllocPurpose::of(what),
        })?;
        let extent = expect_reply!(reply, MetanodeReply::Extent(e) => e, "an extent")?;
        self.granted.lock().insert(extent, seen);
        Ok(extent)
    }

    fn allocate_copies(
        &self,
        pool: PoolId,
        sub_blocks: u32,
        hint: BlockHint,
        copies: u8,
        what: &'static str,
    ) -> FsResult<Vec<Extent>> {
        let seen = self.channel.generation();
        let reply = self.call(MetanodeRequest::AllocateCopies {
            pool,
            sub_blocks,
            hint,
            copies,
            what: AllocPurpose::of(what),
        })?;
        let extents = expect_reply!(reply, MetanodeReply::Extents(e) => e, "extents")?;
        if extents.is_empty() || extents.len() > usize::from(copies.max(1)) {
            return Err(FsError::Corrupt(format!(
                "the metanode gave {} extents for a block of {copies} copies",
                extents.len()
            )));
        }
        let mut granted = self.granted.lock();
        for e in &extents {
            granted.insert(*e, seen);
        }
        Ok(extents)
    }

    fn allocate_on(
        &self,
        _pool: PoolId,
        _sub_blocks: u32,
        _hint: BlockHint,
        _allowed: &dyn Fn(DiskIndex) -> bool,
        what: &'static str,
    ) -> FsResult<Extent> {
        Err(FsError::NotSupported(format!(
            "allocating {what} on chosen disks from another node; a restripe runs where \
             the file system's metadata is owned"
        )))
    }

    fn allocate_first_fragment(
        &self,
        pool: PoolId,
        sub_blocks: u32,
        _hint: BlockHint,
        what: &'static str,
    ) -> FsResult<Extent> {
        let now = self.channel.generation();
        let count = {
            let mut fragments = self.fragments.lock();
            let kept = fragments.entry((pool, sub_blocks)).or_default();
            // Given by an owner since replaced (the fence also empties the reserve).
            kept.retain(|(_, g)| *g == now);
            if let Some((extent, _)) = kept.pop() {
                return Ok(extent);
            }
            fragments_to_ask(&fragments, sub_blocks)
        };
        let reply = self.call(MetanodeRequest::AllocateFragments {
            pool,
            sub_blocks,
            count,
            what: AllocPurpose::of(what),
        })?;
        let mut given = expect_reply!(reply, MetanodeReply::Extents(e) => e, "extents")?;
        if given.is_empty()
            || given.len() > count as usize
            || given.iter().any(|e| e.sub_blocks != sub_blocks)
        {
            return Err(FsError::Corrupt(format!(
                "the metanode gave {given:?} where 1 to {count} fragments of \
                 {sub_blocks} sub-blocks were asked"
            )));
        }
        let mut granted = self.granted.lock();
        for e in &given {
            granted.insert(*e, now);
        }
        drop(granted);
        let first = given.remove(0);
        // Used in the order given (the reserve is taken from its end), next to each other.
        self.fragments
            .lock()
            .entry((pool, sub_blocks))
            .or_default()
            .extend(given.into_iter().rev().map(|e| (e, now)));
        Ok(first)
    }

    fn abandon(&self, extent: Extent) {
        // Only space this client holds unmapped from the owner it sends to now. A mapped
        // extent is its owner's to free (a write that failed after its update was logged).
        // One an owner since replaced gave out was never known to its successor, which may
        // have given the same space to another file meanwhile (it held it free): an Abandon
        // reaching the successor would free that file's space, and the next file given it
        // would write over the first. So the request is pinned to the giving owner too: a
        // move while it waits drops it (leaked until that space is next counted, never
        // given out twice).
        let Some(given_by) = self.granted.lock().remove(&extent) else {
            return;
        };
        let request = encode(&MetanodeRequest::Abandon { extent });
        let started = std::time::Instant::now();
        let sent = self.channel.call_seen(request, given_by);
        self.sent.note("Abandon", started);
        let answered = sent
            .and_then(|bytes| self.unwrap_reply(&bytes, None, None, &Vec::new()))
            .and_then(|(reply, _)| expect_reply!(reply, MetanodeReply::Done => (), "done"));
        if let Err(e) = answered {
            // The extent stays out of the allocator until the owner's next mount finds it
            // unreferenced: leaked for now, never lost or given out twice.
            tracing::warn!("giving back extent {extent:?}: {e}");
        }
    }
}

impl Namespace for RemoteMetanode {
    fn attr(&self, ino: Ino) -> FsResult<Attr> {
        let generation = self.channel.generation();
        if let Some(attr) = self.held.get(ino, generation, |of| of.attr) {
            return Ok(attr);
        }
        let (reply, held) = self.call_held(MetanodeRequest::Attr { ino })?;
        let attr = expect_reply!(reply?, MetanodeReply::Attr(a) => a, "attributes")?;
        if let Some(seq) = held {
            self.held
                .keep(ino, generation, seq, |of| of.attr = Some(attr));
        }
        Ok(attr)
    }

    fn attr_and_bytes(&self, ino: Ino) -> FsResult<(Attr, u64)> {
        let generation = self.channel.generation();
        let both = |of: &crate::read_tokens::HeldOf| Some((of.attr?, of.held_bytes?));
        if let Some(both) = self.held.get(ino, generation, both) {
            return Ok(both);
        }
        let (reply, held) = self.call_held(MetanodeRequest::AttrBytes { ino })?;
        let (attr, bytes) = expect_reply!(
            reply?,
            MetanodeReply::AttrBytes(a, n) => (a, n),
            "attributes and bytes"
        )?;
        if let Some(seq) = held {
            self.held.keep(ino, generation, seq, |of| {
                of.attr = Some(attr);
                of.held_bytes = Some(bytes);
            });
        }
        Ok((attr, bytes))
    }

    fn held_bytes(&self, ino: Ino) -> FsResult<u64> {
        let generation = self.channel.generation();
        if let Some(n) = self.held.get(ino, generation, |of| of.held_bytes) {
            return Ok(n);
        }
        let (reply, held) = self.call_held(MetanodeRequest::HeldBytes { ino })?;
        let n = expect_reply!(reply?, MetanodeReply::Count(n) => n, "a count")?;
        if let Some(seq) = held {
            self.held
                .keep(ino, generation, seq, |of| of.held_bytes = Some(n));
        }
        Ok(n)
    }

    fn find(&self, parent: Ino, name: &[u8]) -> FsResult<Attr> {
        let generation = self.channel.generation();
        // "." and ".." are no entries of the directory's names.
        let dots = name == b"." || name == b"..";
        let known = |of: &crate::read_tokens::HeldOf| match of.names.get(name) {
            Some(now) => Some(*now),
            None if of.complete && !dots => Some(None),
            None => None,
        };
        let named = || {
            (!dots)
                .then(|| self.held_named(parent, name, generation))
                .flatten()
                .map(Some)
        };
        match self.held.get(parent, generation, known).or_else(named) {
            Some(None) => return Err(FsError::NotFound),
            // Attributes held too: no question. Otherwise the caller asks whoever serves
            // the inode by its owner map: this owner, or another slot's (a directory made
            // for it), which this one would only answer is elsewhere, a round trip per
            // lookup of such a directory's name.
            Some(Some(ino)) => {
                return match self.held.get(ino, generation, |of| of.attr) {
                    Some(attr) => Ok(attr),
                    None => Err(FsError::InodeElsewhere { ino }),
                };
            }
            None => {}
        }
        let (reply, held) = self.call_held(MetanodeRequest::Find {
            parent,
            name: name.to_vec(),
        })?;
        let found = match reply {
            Ok(MetanodeReply::Found(attr, bytes, name_kept)) => {
                // The inode under its own token, the name under its own (every `Found`
                // grants both) and under its directory's when that was granted too.
                if let Some(seq) = held {
                    self.held.keep(attr.ino, generation, seq, |of| {
                        of.attr = Some(attr);
                        of.held_bytes = Some(bytes);
                    });
                    self.keep_named(parent, name, attr.ino, generation, seq);
                    if name_kept {
                        self.held.keep(parent, generation, seq, |of| {
                            of.names.insert(name.to_vec(), Some(attr.ino));
                        });
                    }
                }
                return Ok(attr);
            }
            Ok(reply) => Some(expect_reply!(reply, MetanodeReply::Attr(a) => a, "attributes")?),
            Err(FsError::NotFound) => None,
            Err(FsError::InodeElsewhere { ino }) => {
                if let Some(seq) = held {
                    self.held.keep(parent, generation, seq, |of| {
                        of.names.insert(name.to_vec(), Some(ino));
                    });
                }
                return Err(FsError::InodeElsewhere { ino });
            }
            Err(e) => return Err(e),
        };
        if let Some(seq) = held {
            // The name under the directory's token, the attributes under the child's.
            self.held.keep(parent, generation, seq, |of| {
                of.names.insert(name.to_vec(), found.map(|a| a.ino));
            });
            if let Some(attr) = found {
                self.held
                    .keep(attr.ino, generation, seq, |of| of.attr = Some(attr));
            }
        }
        found.ok_or(FsError::NotFound)
    }

    fn make(&self, parent: Ino, name: &[u8], node: NewNode) -> FsResult<Attr> {
        let generation = self.channel.generation();
        let (reply, held) = self.call_held(self.once(MetanodeRequest::Make {
            parent,
            name: name.to_vec(),
            node,
        }))?;
        match reply? {
            MetanodeReply::Attr(attr) => Ok(attr),
            MetanodeReply::Made(attr, bytes, view, kept) => {
                if kept {
                    MADE_KEPT.set(Some(attr.ino));
                }
                // Granted: the new inode under its own token, its name under the
                // directory's (this client still holds the directory: the owner keeps
                // the node whose request changed it as a holder).
                if let Some(seq) = held {
                    self.held.keep(attr.ino, generation, seq, |of| {
                        of.attr = Some(attr);
                        of.held_bytes = Some(bytes);
                        if let Some(view) = view {
                            of.views.insert((0, 0), view);
                        }
                        // A directory just made has no names yet.
                        of.complete = attr.kind == crate::inode::FileKind::Directory;
                    });
                    self.held.keep_held(parent, generation, seq, |of| {
                        of.names.insert(name.to_vec(), Some(attr.ino));
                    });
                    self.keep_named(parent, name, attr.ino, generation, seq);
                }
                Ok(attr)
            }
            other => Err(mismatch(other, "attributes")),
        }
    }

    fn link_target(&self, ino: Ino) -> FsResult<Vec<u8>> {
        self.bytes(MetanodeRequest::LinkTarget { ino })
    }

    fn drop_name(&self, parent: Ino, name: &[u8], dir: bool) -> FsResult<()> {
        self.done(self.once(MetanodeRequest::DropName {
            parent,
            name: name.to_vec(),
            dir,
        }))
    }

    fn seal_dir(&self, ino: Ino, named_in: Option<Ino>) -> FsResult<()> {
        self.done(MetanodeRequest::SealDir { ino, named_in })
    }

    fn drop_entry_of(&self, parent: Ino, name: &[u8], ino: Ino) -> FsResult<()> {
        self.done(self.once(MetanodeRequest::DropEntryOf {
            parent,
            name: name.to_vec(),
            ino,
        }))
    }

    fn drop_sealed_dir(&self, ino: Ino) -> FsResult<()> {
        self.done(self.once(MetanodeRequest::DropSealedDir { ino }))
    }

    fn put_entry(
        &self,
        dir: Ino,
        name: &[u8],
        (ino, kind): (Ino, FileKind),
        replace: Option<Ino>,
    ) -> FsResult<()> {
        self.done(self.once(MetanodeRequest::PutEntry {
            dir,
            name: name.to_vec(),
            ino,
            kind,
            replace,
        }))
    }

    fn take_entry(&self, dir: Ino, name: &[u8], ino: Ino) -> FsResult<()> {
        self.done(self.once(MetanodeRequest::TakeEntry {
            dir,
            name: name.to_vec(),
            ino,
        }))
    }

    fn count_link(&self, ino: Ino, up: bool) -> FsResult<()> {
        self.done(self.once(MetanodeRequest::CountLink { ino, up }))
    }

    fn reparent(&self, dir: Ino, from: Ino, to: Ino) -> FsResult<()> {
        self.done(self.once(MetanodeRequest::Reparent { dir, from, to }))
    }

    fn disk_free(&self) -> FsResult<Vec<(u32, u64, u64)>> {
        expect_reply!(self.call(MetanodeRequest::DiskFree)?, MetanodeReply::DiskFree(d) => d, "free space per disk")
    }

    fn file_pool(&self, ino: Ino) -> FsResult<u16> {
        let pool = expect_reply!(self.call(MetanodeRequest::FilePool { ino })?, MetanodeReply::Count(p) => p, "a file's pool")?;
        u16::try_from(pool).map_err(|_| FsError::Corrupt(format!("pool {pool} of inode {ino}")))
    }

    fn migrate_file(&self, ino: Ino, pool: u16, move_data: bool) -> FsResult<u64> {
        let request = MetanodeRequest::MigrateFile {
            ino,
            pool,
            move_data,
        };
        expect_reply!(self.call(request)?, MetanodeReply::Count(b) => b, "a file's migration")
    }

    fn restripe_batch(
        &self,
        mode: crate::restripe::RestripeMode,
        shard: u32,
        cursor: &crate::restripe::RestripeCursor,
    ) -> FsResult<crate::restripe::RestripeBatch> {
        let request = MetanodeRequest::RestripeBatch {
            mode,
            shard,
            cursor: cursor.clone(),
        };
        expect_reply!(self.call(request)?, MetanodeReply::Restriped(b) => b, "a restripe batch")
    }

    fn drop_disks(&self, disks: &[u16]) -> FsResult<()> {
        self.done(MetanodeRequest::DropDisks {
            disks: disks.to_vec(),
        })
    }

    fn hold_map_writes(&self, hold: bool, id: u64) -> FsResult<()> {
        self.done(MetanodeRequest::HoldMapWrites { hold, id })
    }

    fn move_slot_region(&self, to: &crate::slot::SlotRegion, give_up: bool) -> FsResult<bool> {
        let request = MetanodeRequest::MoveSlotRegion {
            to: to.clone(),
            give_up,
        };
        expect_reply!(self.call(request)?, MetanodeReply::Count(n) => n != 0, "moving an owner slot's region")
    }

    fn record_slot_log(&self, slot: u32, log_id: [u8; 16], behind: Option<u8>) -> FsResult<()> {
        self.done(MetanodeRequest::RecordSlotLog {
            slot,
            log_id,
            behind,
        })
    }

    fn restore_copies(&self, rewrite: bool) -> FsResult<(u64, u64)> {
        let request = MetanodeRequest::RestoreCopies { rewrite };
        expect_reply!(self.call(request)?, MetanodeReply::Restriped(b) => (b.scanned, b.changed), "restoring an owner slot's metadata copies")
    }

    fn move_pages_off(&self, budget: u32) -> FsResult<u64> {
        let request = MetanodeRequest::MovePagesOff { budget };
        expect_reply!(self.call(request)?, MetanodeReply::Count(n) => n, "moving metadata pages")
    }

    fn add_name(&self, ino: Ino, parent: Ino, name: &[u8]) -> FsResult<Attr> {
        self.attr_of(self.once(MetanodeRequest::AddName {
            ino,
            parent,
            name: name.to_vec(),
        }))
    }

    fn move_name(&self, from: (Ino, &[u8]), to: (Ino, &[u8]), how: RenameHow) -> FsResult<()> {
        self.done(self.once(MetanodeRequest::MoveName {
            from: (from.0, from.1.to_vec()),
            to: (to.0, to.1.to_vec()),
            how,
        }))
    }

    fn change_attr(&self, ino: Ino, set: SetAttr) -> FsResult<Attr> {
        self.attr_of(MetanodeRequest::ChangeAttr { ino, set })
    }

    fn opened(&self, ino: Ino) -> FsResult<Attr> {
        self.attr_of(MetanodeRequest::Opened { ino })
    }

    fn closed(&self, ino: Ino) -> FsResult<()> {
        self.done(MetanodeRequest::Closed { ino })
    }

    fn entries(&self, ino: Ino, after: u64) -> FsResult<DirListing> {
        let reply = self.call(MetanodeRequest::Entries { ino, after })?;
        expect_reply!(reply, MetanodeReply::Listing(l) => l, "directory entries")
    }

    fn space(&self) -> StatFs {
        match self.call(MetanodeRequest::Space) {
            Ok(MetanodeReply::Space(s)) => s,
            other => {
                // statfs has no error to give: report an empty file system and say why.
                tracing::warn!("statfs from the file system manager: {other:?}");
                StatFs {
                    block_bytes: 4096,
                    fragment_bytes: 4096,
                    fragments_total: 0,
                    fragments_free: 0,
                    inodes_total: 0,
                    inodes_free: 0,
                    name_bytes_max: crate::namespace::NAME_BYTES_MAX as u32,
                }
            }
        }
    }

    fn put_xattr(&self, ino: Ino, name: &[u8], value: &[u8], how: XattrHow) -> FsResult<()> {
        self.done(MetanodeRequest::PutXattr {
            ino,
            name: name.to_vec(),
            value: value.to_vec(),
            how,
        })
    }

    fn xattr(&self, ino: Ino, name: &[u8]) -> FsResult<Vec<u8>> {
        self.bytes(MetanodeRequest::Xattr {
            ino,
            name: name.to_vec(),
        })
    }

    fn xattr_names(&self, ino: Ino) -> FsResult<Vec<u8>> {
        self.bytes(MetanodeRequest::XattrNames { ino })
    }

    fn drop_xattr(&self, ino: Ino, name: &[u8]) -> FsResult<()> {
        self.done(MetanodeRequest::DropXattr {
            ino,
            name: name.to_vec(),
        })
    }

    fn put_acl(
        &self,
        ino: Ino,
        kind: AclKind,
        value: &[u8],
        how: XattrHow,
        drop_setgid: bool,
    ) -> FsResult<()> {
        self.done(MetanodeRequest::PutAcl {
            ino,
            kind,
            value: value.to_vec(),
            how,
            drop_setgid,
        })
    }

    fn lock(
        &self,
        ino: Ino,
        call: LockCall,
        _origin: Option<crate::locks::Origin>,
    ) -> FsResult<Option<Lock>> {
        // The owner learns where it came from from the transport.
        let reply = self.call(MetanodeRequest::Lock { ino, call })?;
        expect_reply!(reply, MetanodeReply::Lock(l) => l, "a lock answer")
    }

    fn drop_kept(
        &self,
        holder: crate::locks::Holder,
        inos: &[Ino],
        _origin: Option<crate::locks::Origin>,
    ) -> FsResult<()> {
        self.done(MetanodeRequest::DropKept {
            holder,
            inos: inos.to_vec(),
        })
    }

    fn gather(&self, ino: Ino, _origin: Option<crate::locks::Origin>) -> FsResult<bool> {
        let reply = self.call(MetanodeRequest::Gather { ino })?;
        expect_reply!(reply, MetanodeReply::Count(n) => n == 1, "a count")
    }

    fn protection(&self, ino: Ino) -> FsResult<Protection> {
        let generation = self.channel.generation();
        // Kept under the protection's own token (`read_tokens::protection_key`).
        let key = crate::read_tokens::protection_key(ino);
        if let Some(p) = self.held.get(key, generation, |of| of.protection.clone()) {
            return Ok(p);
        }
        let (reply, held) = self.call_held(MetanodeRequest::Protection { ino })?;
        let (attr, acl) =
            expect_reply!(reply?, MetanodeReply::Protection(a, l) => (a, l), "a protection")?;
        let protection = RemoteMetanode::protection_of(attr, acl)?;
        if let Some(seq) = held {
            let kept = protection.clone();
            self.held
                .keep(key, generation, seq, |of| of.protection = Some(kept));
        }
        Ok(protection)
    }
}

/// The channel from this node's client to this node's own owner, through the encoded form
/// (see the module's comment). It holds the file system weakly: the file system holds it.
pub(crate) struct Loopback(pub Weak<FileSystem>);

/// A client's way to an owner mounted in the same process, through the owner's whole
/// answer to another node (`FileSystem::serve_metanode_request`: commits, kernel-cache
/// notices): what the node transport delivers, without the network. For tests of
/// client-only mounts.
pub struct InProcessOwner(pub Weak<FileSystem>);

impl MetanodeChannel for InProcessOwner {
    fn call(&self, request: Vec<u8>) -> FsResult<Vec<u8>> {
        let owner = self
            .0
            .upgrade()
            .ok_or_else(|| FsError::Io(std::io::Error::other("the owner is unmounted")))?;
        Ok(owner.serve_metanode_request(&request))
    }
}

/// A client's way to an owner in this process whose requests the owner takes as coming
/// from node `origin` (as the node transport marks another node's): the owner grants it
/// views it keeps (`read_tokens.rs`). For tests that run a client as another node.
pub struct InProcessNode {
    pub owner: Weak<FileSystem>,
    pub origin: crate::locks::Origin,
}

impl MetanodeChannel for InProcessNode {
    fn call(&self, request: Vec<u8>) -> FsResult<Vec<u8>> {
        let owner = self
            .owner
            .upgrade()
            .ok_or_else(|| FsError::Io(std::io::Error::other("the owner is unmounted")))?;
        Ok(owner.serve_metanode_request_from(Some(self.origin), &request))
    }
}

impl MetanodeChannel for Loopback {
    fn call(&self, request: Vec<u8>) -> FsResult<Vec<u8>> {
        let fs: Arc<FileSystem> = self.0.upgrade().ok_or_else(|| {
            FsError::Invalid("the file system behind the metanode loopback is gone".into())
        })?;
        let request = decode::<MetanodeRequest>(&request, "request")?;
        Ok(encode(&serve(&*fs, request)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inode::{FileKind, Timestamp};

    fn attr() -> Attr {
        Attr {
            ino: 7,
            kind: FileKind::Regular,
            perm: 0o644,
            uid: 1,
            gid: 2,
            nlink: 1,
            size: 3,
            rdev: 0,
            atime: Timestamp::default(),
            mtime: Timestamp::default(),
            ctime: Timestamp::default(),
            crtime: Timestamp::default(),
            generation: 0,
        }
    }

    #[test]
    fn every_error_a_client_matches_on_survives_the_wire() {
        let errors = [
            FsError::NotFound,
            FsError::Exists,
            FsError::NotEmpty,
            FsError::NameTooLong,
            FsError::NoXattr,
            FsError::Range { size: 65_536 },
            FsError::NoSpace {
                pool: "system".into(),
                what: "fallocate",
            },
            FsError::NoInodes { max: 10 },
            FsError::PermissionDenied,
            FsError::NotPermitted("chown".into()),
            FsError::Io(std::io::Error::from_raw_os_error(libc::EIO)),
        ];
        for e in errors {
            let wire: RemoteError = decode(&encode(&RemoteError::from(&e)), "error").unwrap();
            let back = FsError::from(wire);
            assert_eq!(back.errno(), e.errno(), "{e} came back as {back}");
            assert_eq!(back.to_string(), e.to_string());
        }
    }

    #[test]
    fn owner_messages_are_told_apart() {
        let changed = Fence::descriptor_changed();
        let stopped = Fence::disk_availability(vec!["d1".into()], false);
        let revoked = Fence::drop_held(vec![7]);
        for every in [&changed, &stopped] {
            assert!(Fence::is_fence(every) && Fence::is_for_every_metanode(every));
            assert!(!Fence::is_revocation(every));
        }
        assert!(Fence::is_fence(&revoked) && Fence::is_revocation(&revoked));
        // A revocation is for the mount that holds what it takes back, not for every
        // metanode instance of the node; garbage is neither.
        assert!(!Fence::is_for_every_metanode(&revoked));
        assert!(!Fence::is_for_every_metanode(&[0xff, 0xfe, 0x00]));
    }

    #[test]
    fn requests_and_replies_round_trip_and_garbage_is_refused() {
        let requests = [
            MetanodeRequest::Find {
                parent: 1,
                name: b"a".to_vec(),
            },
            MetanodeRequest::MoveName {
                from: (1, b"a".to_vec()),
                to: (9, b"b".to_vec()),
                how: RenameHow {
                    noreplace: true,
                    exchange: false,
                    dirs_may_move: false,
                },
            },
            MetanodeRequest::View {
                ino: 7,
                blocks: 3..9,
            },
            MetanodeRequest::Space,
            MetanodeRequest::FenceWrites {
                owner: 3,
                incarnation: 17,
                slot: 2,
            },
            MetanodeRequest::FenceSettled {
                replayed: true,
                slot: 2,
            },
            MetanodeRequest::Lock {
                ino: 12,
                call: LockCall {
                    lock: Lock {
                        holder: crate::locks::Holder {
                            client: 0xfeed,
                            owner: 3,
                            class: crate::locks::LockClass::Flock,
                        },
                        start: 0,
                        end: crate::locks::TO_END,
                        kind: crate::locks::LockKind::Write,
                        pid: 4321,
                    },
                    test: false,
                    wait: true,
                },
            },
            MetanodeRequest::DropHeld { inos: vec![5, 9] },
            MetanodeRequest::GiveBackData { inos: vec![12] },
            MetanodeRequest::Leaving,
            MetanodeRequest::DescriptorChanged,
            MetanodeRequest::DiskAvailability {
                nsds: vec!["d1".into(), "d2".into()],
                up: false,
            },
            MetanodeRequest::PutEntry {
                dir: 9,
                name: b"to".to_vec(),
                ino: 12,
                kind: FileKind::Regular,
                replace: Some(13),
            },
            MetanodeRequest::TakeEntry {
                dir: 7,
                name: b"from".to_vec(),
                ino: 12,
            },
            MetanodeRequest::CountLink { ino: 12, up: true },
            MetanodeRequest::Reparent {
                dir: 12,
                from: 7,
                to: 9,
            },
            MetanodeRequest::DiskFree,
            MetanodeRequest::FilePool { ino: 77 },
            MetanodeRequest::MigrateFile {
                ino: 78,
                pool: 1,
                move_data: true,
            },
            MetanodeRequest::RestripeBatch {
                mode: crate::restripe::RestripeMode::Replicate,
                shard: 17,
                cursor: crate::restripe::RestripeCursor {
                    from: vec![1, 2, 3],
                    file: 99,
                    copies: 2,
                },
            },
            MetanodeRequest::MovePagesOff { budget: 512 },
            MetanodeRequest::DropDisks { disks: vec![2, 5] },
            MetanodeRequest::HoldMapWrites {
                hold: true,
                id: 0x5eed,
            },
            MetanodeRequest::MoveSlotRegion {
                to: crate::slot::SlotRegion {
                    slot: 2,
                    disk: 1,
                    offset: 64 << 20,
                    bytes: 8 << 20,
                    record_bytes: 8192,
                    log_id: [0x5a; 16],
                    second: None,
                },
                give_up: false,
            },
            MetanodeRequest::AllocateFragments {
                pool: 1,
                sub_blocks: 2,
                count: 16,
                what: AllocPurpose::of("file data"),
            },
            MetanodeRequest::DropKept {
                holder: crate::locks::Holder {
                    client: 0xfeed,
                    owner: crate::locks::KEPT_DATA_OWNER,
                    class: crate::locks::LockClass::Data,
                },
                inos: vec![12, 13, 40],
            },
            MetanodeRequest::ProvideRegion { slot: 3 },
            MetanodeRequest::GiveSlotBack,
            MetanodeRequest::GiveRegionBack,
            MetanodeRequest::Gather { ino: 12 },
            MetanodeRequest::RecordSlotLog {
                slot: 4,
                log_id: [9; 16],
                behind: Some(1),
            },
            MetanodeRequest::RecordSlotLog {
                slot: 4,
                log_id: [0xfe; 16],
                behind: None,
            },
            MetanodeRequest::RestoreCopies { rewrite: true },
        ];
        for r in requests {
            let bytes = encode(&r);
            assert_eq!(decode::<MetanodeRequest>(&bytes, "request").unwrap(), r);
            let mut longer = bytes.clone();
            longer.push(0);
            assert!(decode::<MetanodeRequest>(&longer, "request").is_err());
            if bytes.len() > 1 {
                assert!(decode::<MetanodeRequest>(&bytes[..bytes.len() - 1], "request").is_err());
            }
        }
        let reply = MetanodeReply::Protection(attr(), Some(vec![2, 0, 0, 0]));
        match decode::<MetanodeReply>(&encode(&reply), "reply").unwrap() {
            MetanodeReply::Protection(a, Some(acl)) => {
                assert_eq!(a, attr());
                assert_eq!(acl, vec![2, 0, 0, 0]);
            }
            other => panic!("{other:?}"),
        }
        assert!(decode::<MetanodeRequest>(&[0xff; 7], "request").is_err());
        assert!(decode::<MetanodeRequest>(&[], "request").is_err());
    }

    #[test]
    fn a_request_nested_in_once_twice_is_refused_without_recursing() {
        let once = |request| MetanodeRequest::Once {
            client: 1,
            seq: 1,
            request: Box::new(request),
        };
        let one = encode(&once(MetanodeRequest::Space));
        assert_eq!(
            decode::<MetanodeRequest>(&one, "request").unwrap(),
            once(MetanodeRequest::Space)
        );
        let two = encode(&once(once(MetanodeRequest::Space)));
        // postcard reports the refusal as a malformed message (its error keeps no text).
        let e = decode::<MetanodeRequest>(&two, "request").unwrap_err();
        assert!(e.to_string().contains("malformed metanode request"), "{e}");
        // A million levels, built as bytes (encoding them would recurse too): the prefix
        // of one level repeated, then the innermost request.
        let level = &one[..one.len() - encode(&MetanodeRequest::Space).len()];
        let mut deep = level.repeat(1_000_000);
        deep.extend_from_slice(&encode(&MetanodeRequest::Space));
        assert!(decode::<MetanodeRequest>(&deep, "request").is_err());
        // The decoder of this thread is usable again after a refusal.
        assert!(decode::<MetanodeRequest>(&one, "request").is_ok());
    }

    #[test]
    fn held_answers_and_change_lists_open_and_nested_lists_are_refused() {
        let absent = encode(&MetanodeReply::Held(HeldReply::Absent));
        let changed = MetanodeReply::Changed {
            inos: Some(vec![3, 9]),
            reply: absent.clone(),
            fresh: vec![(attr(), 4096)],
        };
        let opened = open_reply(&encode(&changed)).unwrap();
        assert_eq!(opened.changed, Some(Some(vec![3, 9])));
        assert_eq!(opened.fresh, vec![(attr(), 4096)]);
        assert!(opened.held);
        assert!(matches!(
            opened.reply,
            MetanodeReply::Failed(RemoteError::NotFound)
        ));
        let opened = open_reply(&encode(&MetanodeReply::Held(HeldReply::Attr(attr())))).unwrap();
        assert!(opened.held && opened.changed.is_none());
        assert!(matches!(opened.reply, MetanodeReply::Attr(a) if a == attr()));
        // A name whose inode another slot serves is held, and answers where to ask.
        let opened = open_reply(&encode(&MetanodeReply::Held(HeldReply::Elsewhere(77)))).unwrap();
        assert!(opened.held);
        assert!(matches!(
            opened.reply,
            MetanodeReply::Failed(RemoteError::InodeElsewhere { ino: 77 })
        ));
        let plain = open_reply(&encode(&MetanodeReply::Count(4))).unwrap();
        assert!(!plain.held && plain.changed.is_none());
        let nested = MetanodeReply::Changed {
            inos: None,
            reply: encode(&changed),
            fresh: Vec::new(),
        };
        let e = open_reply(&encode(&nested)).err().expect("refused");
        assert!(e.to_string().contains("inside a change list"), "{e}");
        let broken = MetanodeReply::Changed {
            inos: None,
            reply: vec![0xff, 0xff],
            fresh: Vec::new(),
        };
        assert!(open_reply(&encode(&broken)).is_err());
    }

    /// What a fenced client hands over is checked before it is applied: garbage, a
    /// refusal, and an update that maps space another file holds are refused with the
    /// file untouched; an update of space that is free is applied and claims it.
    #[test]
    fn a_replayed_update_is_refused_when_its_space_is_anothers() {
        let dir = tempfile::tempdir().unwrap();
        let fs = crate::owner::tests::mounted(dir.path());
        let me = crate::Caller { uid: 0, gid: 0 };
        let root = crate::ROOT_INO;
        let make = |name: &[u8]| {
            fs.create_node(root, name, FileKind::Regular, 0o644, 0, me, None)
                .unwrap()
        };
        let (a, b) = (make(b"a"), make(b"b"));
        let bs = fs.geo.block_bytes as usize;
        let data = vec![5u8; bs];
        fs.write(a.ino, 0, &data, true).unwrap();
        let held = Metanode::view(&*fs, a.ino, 0..1)
            .unwrap()
            .block(0)
            .unwrap()
            .clone();

        assert!(fs.replay_fenced(b"\xff\xfe garbage", None).is_err());
        let refused = encode(&MetanodeReply::Failed(RemoteError::from(&FsError::Fenced)));
        assert!(fs.replay_fenced(&refused, None).is_err());
        let steal = MetanodeReply::Replay(vec![(
            b.ino,
            FileUpdate::content(vec![Change::MapBlock {
                ino: b.ino,
                index: 0,
                block: held.clone(),
            }]),
        )]);
        let e = fs.replay_fenced(&encode(&steal), None).unwrap_err();
        assert!(e.to_string().contains("could not be applied"), "{e}");
        assert!(Metanode::view(&*fs, b.ino, 0..1)
            .unwrap()
            .block(0)
            .is_none());
        assert_eq!(fs.read(a.ino, 0, bs as u32).unwrap(), data);

        // Space the dead owner gave out and never logged: free here, claimed by the replay.
        let extent = BlockAllocator::allocate(
            &*fs,
            Metanode::view(&*fs, b.ino, 0..0).unwrap().pool,
            fs.geo.sub_blocks_per_block,
            BlockHint {
                file_key: b.ino,
                block_index: 0,
                prev: None,
            },
            "file data",
        )
        .unwrap();
        BlockAllocator::abandon(&*fs, extent);
        let block = crate::inode::BlockRef::new_unwritten(extent, fs.extent_sectors(&extent));
        let given = MetanodeReply::Replay(vec![(
            b.ino,
            FileUpdate::content(vec![Change::MapBlock {
                ino: b.ino,
                index: 0,
                block,
            }]),
        )]);
        assert_eq!(fs.replay_fenced(&encode(&given), None).unwrap(), 1);
        let mapped = Metanode::view(&*fs, b.ino, 0..1).unwrap();
        assert_eq!(mapped.block(0).unwrap().extent, extent);
        // Claimed: the allocator does not give it out again.
        let next = BlockAllocator::allocate(
            &*fs,
            mapped.pool,
            fs.geo.sub_blocks_per_block,
            BlockHint {
                file_key: a.ino,
                block_index: 1,
                prev: None,
            },
            "file data",
        )
        .unwrap();
        assert_ne!(next, extent);
        fs.unmount().unwrap();
    }

    /// Counts the requests it carries to a loopback.
    struct Counted(Loopback, Arc<std::sync::atomic::AtomicUsize>);

    impl MetanodeChannel for Counted {
        fn call(&self, request: Vec<u8>) -> FsResult<Vec<u8>> {
            self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.0.call(request)
        }
    }

    #[test]
    fn a_client_routed_through_the_wire_reaches_its_owner_for_every_operation() {
        let dir = tempfile::tempdir().unwrap();
        let fs = crate::owner::tests::mounted(dir.path());
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let channel = Counted(Loopback(Arc::downgrade(&fs)), calls.clone());
        assert!(fs
            .remote
            .set(Arc::new(RemoteMetanode::new(
                Box::new(channel),
                fs.devices.clone()
            )))
            .is_ok());
        // Every request of this mount goes through the wire to its own owner.
        fs.loopback.store(true, std::sync::atomic::Ordering::SeqCst);
        let count = || calls.load(std::sync::atomic::Ordering::Relaxed);
        let me = crate::Caller { uid: 0, gid: 0 };
        let root = crate::ROOT_INO;

        let before = count();
        let d = fs
            .create_node(root, b"d", FileKind::Directory, 0o755, 0, me, None)
            .unwrap();
        let f = fs
            .create_node(d.ino, b"f", FileKind::Regular, 0o644, 0, me, None)
            .unwrap();
        assert!(count() >= before + 2);

        // Data: a view and an update per write, a view per read, all through the wire.
        let before = count();
        let data = vec![7u8; 300_000];
        assert_eq!(fs.write(f.ino, 5, &data, true).unwrap(), data.len());
        assert_eq!(fs.read(f.ino, 5, 300_000).unwrap(), data);
        assert!(count() > before + 2);
        assert_eq!(fs.getattr(f.ino).unwrap().size, 300_005);

        // Errors keep their identity: EEXIST, ENOENT, ENOTEMPTY.
        let e = fs
            .create_node(d.ino, b"f", FileKind::Regular, 0o644, 0, me, None)
            .unwrap_err();
        assert!(matches!(e, FsError::Exists), "{e}");
        assert!(matches!(fs.lookup(d.ino, b"nope"), Err(FsError::NotFound)));
        assert!(matches!(
            fs.remove(root, b"d", true),
            Err(FsError::NotEmpty)
        ));

        fs.rename(d.ino, b"f", root, b"g", false, false).unwrap();
        fs.setxattr(f.ino, b"user.k", b"v", true, false).unwrap();
        assert_eq!(fs.getxattr(f.ino, b"user.k").unwrap(), b"v");
        let listing = fs.readdir(root, 0).unwrap();
        assert!(listing
            .entries
            .iter()
            .any(|(_, ino, _, n)| *ino == f.ino && n == b"g"));
        fs.remove(root, b"g", false).unwrap();
        fs.remove(root, b"d", true).unwrap();
        assert!(matches!(fs.getattr(f.ino), Err(FsError::NotFound)));
        assert!(fs.statfs().inodes_total > 0);
        fs.unmount().unwrap();
    }

    proptest::proptest! {
        /// No byte string makes the decoder panic or hand out a request that does not
        /// encode back to the same bytes it came from.
        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(0u8..=255, 0..200)) {
            if let Ok(r) = decode::<MetanodeRequest>(&bytes, "request") {
                let again: MetanodeRequest = decode(&encode(&r), "request").unwrap();
                proptest::prop_assert_eq!(again, r);
            }
            let _ = decode::<MetanodeReply>(&bytes, "reply");
            let _ = open_reply(&bytes);
        }
    }
}
