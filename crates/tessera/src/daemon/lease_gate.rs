//! Disk I/O only under a disk lease. Every device a mounted file system uses is wrapped so
//! that a read, write or flush is refused while this node holds no valid lease: a node cut
//! off from the cluster manager stops touching shared disks by itself, before the manager
//! expels it and lets other nodes recover its work. The check is made when the request is
//! submitted; the lease runs out a safety margin before the manager's view of it does, so
//! a request admitted just in time still finishes inside the manager's lease.

use std::io;
use std::sync::Arc;

use tessera_drive::BlockDevice;

/// Whether this node may do I/O now; if not, why (the end of the refusal's message).
pub type LeaseCheck = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

pub struct LeaseGated {
    inner: Arc<dyn BlockDevice>,
    may_do_io: LeaseCheck,
}

impl LeaseGated {
    pub fn wrap(inner: Arc<dyn BlockDevice>, may_do_io: LeaseCheck) -> Arc<dyn BlockDevice> {
        Arc::new(LeaseGated { inner, may_do_io })
    }

    fn admit(&self) -> io::Result<()> {
        (self.may_do_io)().map_err(|why| {
            io::Error::new(
                io::ErrorKind::NotConnected,
                format!("{}: {why}", self.inner.name()),
            )
        })
    }
}

impl std::fmt::Debug for LeaseGated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseGated")
            .field("inner", &self.inner)
            .finish()
    }
}

impl BlockDevice for LeaseGated {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.admit()?;
        self.inner.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.admit()?;
        self.inner.write_at(buf, offset)
    }

    fn write_fua(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.admit()?;
        self.inner.write_fua(buf, offset)
    }

    fn flush(&self) -> io::Result<()> {
        self.admit()?;
        self.inner.flush()
    }

    // A discard destroys data like a write: only under the lease.
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.admit()?;
        self.inner.discard(offset, len)
    }

    fn can_discard(&self) -> bool {
        self.inner.can_discard()
    }

    fn discard_zeroes(&self) -> bool {
        self.inner.discard_zeroes()
    }
}
