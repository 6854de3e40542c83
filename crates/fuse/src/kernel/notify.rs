//! Notifications from the file system to the kernel, written to /dev/fuse by one thread per
//! session: `FUSE_NOTIFY_INVAL_ENTRY`, which drops a name from the kernel's dentry cache,
//! `FUSE_NOTIFY_INVAL_INODE`, which drops an inode's attributes and pages, and
//! `FUSE_NOTIFY_INC_EPOCH`, which makes every cached name invalid.
//!
//! They cannot be written by the request thread that decides them. The kernel holds the
//! directory's inode lock while a request on it (a chmod of the directory, a rename into
//! it) waits for our reply, and invalidating an entry takes that same lock: written
//! inline, the notification would wait for the reply that waits for it. On their own
//! thread, they simply wait until the kernel has finished the request.
//!
//! They are sent for what another node changed through this node's metanode
//! (`tessera_fs::CacheChange`); token revocation will send them too.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use super::abi::{self, put32, put64};

/// One notification for the kernel.
#[derive(Debug)]
pub(crate) enum Notification {
    /// Drop the cached entries `names` of the directory `parent`.
    InvalEntries { parent: u64, names: Vec<Vec<u8>> },
    /// Drop the cached attributes and every cached page of `ino`.
    InvalInode { ino: u64 },
    /// Make every cached name invalid (`FUSE_NOTIFY_INC_EPOCH`).
    IncEpoch,
    /// Say on `done` that every notification queued before this one has been written.
    Barrier { done: mpsc::SyncSender<()> },
}

/// The sending side, held by the request handler. Sending never blocks: the channel is
/// unbounded because a request thread that waited for the notifier could wait for the
/// kernel lock its own unanswered request holds. Its size is bounded by the names of the
/// directories changed meanwhile, which the file system holds in memory anyway.
#[derive(Clone, Debug)]
pub(crate) struct Notifier {
    tx: mpsc::Sender<Notification>,
}

/// The receiving side, served by [`spawn`].
pub(crate) type NotifyQueue = mpsc::Receiver<Notification>;

pub(crate) fn channel() -> (Notifier, NotifyQueue) {
    let (tx, rx) = mpsc::channel();
    (Notifier { tx }, rx)
}

impl Notifier {
    /// Queues the invalidation of `names` in `parent`; nothing happens once the session
    /// has ended (the kernel's cache ended with it).
    pub(crate) fn inval_entries(&self, parent: u64, names: Vec<Vec<u8>>) {
        if names.is_empty() {
            return;
        }
        let _ = self.tx.send(Notification::InvalEntries { parent, names });
    }

    /// Queues the invalidation of `ino`'s attributes and pages.
    pub(crate) fn inval_inode(&self, ino: u64) {
        let _ = self.tx.send(Notification::InvalInode { ino });
    }

    /// Queues making every cached name invalid; only for a kernel that knows it
    /// ([`abi::INC_EPOCH_MINOR`]).
    pub(crate) fn inc_epoch(&self) {
        let _ = self.tx.send(Notification::IncEpoch);
    }

    /// Waits until the kernel has taken every notification queued so far, for at most
    /// `bound`; returns whether it did. Only for callers that are not answering a
    /// kernel request of this mount (see the module documentation): another node's
    /// request served here, which must not return before this node's caches are clean.
    pub(crate) fn wait_written(&self, bound: std::time::Duration) -> bool {
        let (done, written) = mpsc::sync_channel(1);
        if self.tx.send(Notification::Barrier { done }).is_err() {
            return true; // The session has ended, and with it the kernel's caches.
        }
        written.recv_timeout(bound).is_ok()
    }
}

/// The message of one `FUSE_NOTIFY_INVAL_INODE` for the whole file: offset 0 and length 0
/// (the kernel drops the pages from the offset to the end when the length is not
/// positive).
pub(crate) fn inval_inode_message(ino: u64) -> Vec<u8> {
    let mut msg = abi::out_header(
        0,
        abi::NOTIFY_INVAL_INODE,
        abi::NOTIFY_INVAL_INODE_OUT_BYTES,
    )
    .to_vec();
    put64(&mut msg, ino);
    put64(&mut msg, 0); // off
    put64(&mut msg, 0); // len
    debug_assert_eq!(
        msg.len(),
        abi::OUT_HEADER_BYTES + abi::NOTIFY_INVAL_INODE_OUT_BYTES
    );
    msg
}

/// The message of one `FUSE_NOTIFY_INC_EPOCH`: the header alone.
pub(crate) fn inc_epoch_message() -> Vec<u8> {
    abi::out_header(0, abi::NOTIFY_INC_EPOCH, 0).to_vec()
}

/// The message of one `FUSE_NOTIFY_INVAL_ENTRY`: `fuse_out_header` with `unique` 0 and
/// the notify code as `error`, `fuse_notify_inval_entry_out`, the name and a NUL.
pub(crate) fn inval_entry_message(parent: u64, name: &[u8]) -> Vec<u8> {
    let body_bytes = abi::NOTIFY_INVAL_ENTRY_OUT_BYTES + name.len() + 1;
    let mut msg = abi::out_header(0, abi::NOTIFY_INVAL_ENTRY, body_bytes).to_vec();
    put64(&mut msg, parent);
    put32(
        &mut msg,
        u32::try_from(name.len()).expect("names are at most 255 bytes"),
    );
    put32(&mut msg, 0); // flags: invalidate, not only expire
    msg.extend_from_slice(name);
    msg.push(0);
    debug_assert_eq!(msg.len(), abi::OUT_HEADER_BYTES + body_bytes);
    msg
}

/// Writes one notification. ENOENT means the kernel had no such entry cached (or no
/// longer knows the directory): nothing to drop, so not an error.
fn write_message(fd: RawFd, msg: &[u8]) -> io::Result<()> {
    // SAFETY: msg is valid for reads of msg.len() bytes.
    let n = unsafe { libc::write(fd, msg.as_ptr().cast(), msg.len()) };
    if n >= 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::ENOENT) {
        return Ok(());
    }
    Err(e)
}

/// Starts the session's notifier thread. It ends when every [`Notifier`] is gone (the
/// handler is dropped once the request threads have ended) or the connection has.
pub(crate) fn spawn(dev: Arc<OwnedFd>, queue: NotifyQueue) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("fuse-notify".into())
        .spawn(move || {
            for n in queue {
                let (parent, names) = match n {
                    Notification::InvalEntries { parent, names } => (parent, names),
                    Notification::Barrier { done } => {
                        let _ = done.send(());
                        continue;
                    }
                    Notification::IncEpoch => {
                        match write_message(dev.as_raw_fd(), &inc_epoch_message()) {
                            Ok(()) => {}
                            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => return,
                            Err(e) => {
                                tracing::error!("FUSE: cannot make the cached names invalid: {e}")
                            }
                        }
                        continue;
                    }
                    Notification::InvalInode { ino } => {
                        match write_message(dev.as_raw_fd(), &inval_inode_message(ino)) {
                            Ok(()) => {}
                            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => return,
                            Err(e) => tracing::error!(
                                "FUSE: cannot invalidate the cached inode {ino}: {e}"
                            ),
                        }
                        continue;
                    }
                };
                for name in names {
                    match write_message(dev.as_raw_fd(), &inval_entry_message(parent, &name)) {
                        Ok(()) => {}
                        Err(e) if e.raw_os_error() == Some(libc::ENODEV) => return,
                        Err(e) => tracing::error!(
                            "FUSE: cannot invalidate the cached entry {:?} of inode {parent}: {e}",
                            String::from_utf8_lossy(&name)
                        ),
                    }
                }
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::abi::Reader;

    #[test]
    fn inval_entry_layout() {
        let msg = inval_entry_message(0x1234, b"name");
        let mut r = Reader::new(&msg);
        assert_eq!(r.u32(), Some(16 + 16 + 5)); // len
        assert_eq!(r.u32(), Some(3)); // error = FUSE_NOTIFY_INVAL_ENTRY
        assert_eq!(r.u64(), Some(0)); // unique
        assert_eq!(r.u64(), Some(0x1234)); // parent
        assert_eq!(r.u32(), Some(4)); // namelen
        assert_eq!(r.u32(), Some(0)); // flags
        assert_eq!(r.rest(), b"name\0");
    }

    #[test]
    fn inc_epoch_layout() {
        let msg = inc_epoch_message();
        let mut r = Reader::new(&msg);
        assert_eq!(r.u32(), Some(16)); // len: the header alone
        assert_eq!(r.u32(), Some(8)); // error = FUSE_NOTIFY_INC_EPOCH
        assert_eq!(r.u64(), Some(0)); // unique
        assert!(r.rest().is_empty());
    }

    #[test]
    fn inval_inode_layout() {
        let msg = inval_inode_message(0x1234);
        let mut r = Reader::new(&msg);
        assert_eq!(r.u32(), Some(16 + 24)); // len
        assert_eq!(r.u32(), Some(2)); // error = FUSE_NOTIFY_INVAL_INODE
        assert_eq!(r.u64(), Some(0)); // unique
        assert_eq!(r.u64(), Some(0x1234)); // ino
        assert_eq!(r.u64(), Some(0)); // off
        assert_eq!(r.u64(), Some(0)); // len
        assert!(r.rest().is_empty());
    }

    #[test]
    fn sending_after_the_session_is_harmless() {
        let (n, q) = channel();
        n.inval_entries(1, vec![b"a".to_vec()]);
        n.inval_entries(1, Vec::new());
        assert!(matches!(
            q.try_recv(),
            Ok(Notification::InvalEntries { parent: 1, names }) if names == vec![b"a".to_vec()]
        ));
        assert!(q.try_recv().is_err());
        drop(q);
        n.inval_entries(2, vec![b"b".to_vec()]);
    }
}
