//! SIGTERM and SIGINT (and SIGHUP for the drive server) for the long-running commands: they
//! are blocked in every thread (threads inherit the mask) and one thread waits for them, so
//! shutdown runs in order instead of in a signal handler.

use anyhow::{bail, Result};

/// Blocks SIGTERM and SIGINT in the calling thread and every thread it starts afterwards;
/// returns the set for [`wait`].
pub fn block_termination() -> Result<libc::sigset_t> {
    block(&[libc::SIGTERM, libc::SIGINT])
}

/// As [`block_termination`], and SIGHUP too, for servers that reread their configuration.
pub fn block_termination_and_reload() -> Result<libc::sigset_t> {
    block(&[libc::SIGTERM, libc::SIGINT, libc::SIGHUP])
}

fn block(signals: &[libc::c_int]) -> Result<libc::sigset_t> {
    // SAFETY: plain libc calls on a locally owned, initialized signal set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &s in signals {
            libc::sigaddset(&mut set, s);
        }
        let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if rc != 0 {
            bail!(
                "cannot block signals: {}",
                std::io::Error::from_raw_os_error(rc)
            );
        }
        Ok(set)
    }
}

/// Waits for one of the signals of `set`; returns its number.
pub fn wait(set: &libc::sigset_t) -> libc::c_int {
    let mut signal: libc::c_int = 0;
    // SAFETY: `set` is initialized and `signal` is a valid out pointer.
    unsafe { libc::sigwait(set, &mut signal) };
    signal
}
