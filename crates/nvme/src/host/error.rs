//! Errors of the host side, and how they reach `BlockDevice` callers.
//!
//! Inside the host every failure is a [`HostError`]; the one question multipath asks of it
//! is [`HostError::is_path_error`]: may the command be retried on another path? At the
//! `BlockDevice` edge, non-path NVMe errors become an `io::Error` whose payload is an
//! [`NvmeStatusError`], so a caller (fencing, for one) can recover the exact [`Status`] with
//! [`nvme_status`] and tell Reservation Conflict apart from a media error.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use crate::wire::status::sct;
use crate::wire::Status;

/// Why a host operation failed.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The connection to the controller failed or was torn down: the command's fate is
    /// unknown, and it may be retried on another path.
    #[error("{addr}: transport error: {reason}")]
    Transport {
        /// Controller address.
        addr: SocketAddr,
        /// What happened.
        reason: String,
    },
    /// The controller did not answer within the command timeout; the queue was torn down.
    #[error("{addr}: {command} timed out after {} s; the connection was reset",
            .after.as_secs())]
    Timeout {
        /// Controller address.
        addr: SocketAddr,
        /// The command.
        command: &'static str,
        /// The timeout.
        after: Duration,
    },
    /// The controller completed the command with an error status.
    #[error("{addr}: {command} failed: {status}")]
    Status {
        /// Controller address.
        addr: SocketAddr,
        /// The command.
        command: &'static str,
        /// The status.
        status: Status,
    },
    /// The subsystem refused the association (Fabrics Connect failed).
    #[error("{addr}: subsystem {subnqn} refused host {hostnqn}: {status}{hint}")]
    ConnectRefused {
        /// Controller address.
        addr: SocketAddr,
        /// Subsystem NQN.
        subnqn: String,
        /// Host NQN.
        hostnqn: String,
        /// The Connect status.
        status: Status,
        /// What to do about it (starts with "; " when not empty).
        hint: String,
    },
    /// The controller broke the protocol (a PDU or data structure the host cannot accept).
    #[error("{addr}: protocol error: {reason}")]
    Protocol {
        /// Controller address.
        addr: SocketAddr,
        /// What was wrong.
        reason: String,
    },
    /// The request itself is invalid (options, NQNs, alignment); nothing was sent.
    #[error("{0}")]
    Invalid(String),
    /// A local I/O error (host identity file, socket setup).
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        source: io::Error,
    },
}

impl HostError {
    /// Whether the command may be retried on another path: transport failures, timeouts
    /// and the path-related statuses (SCT 3: ANA inaccessible, transition, persistent loss,
    /// pathing errors) plus Transient Transport Error. Retrying is safe because every
    /// command the host sends is idempotent at block level.
    #[must_use]
    pub fn is_path_error(&self) -> bool {
        match self {
            HostError::Transport { .. } | HostError::Timeout { .. } => true,
            HostError::Status { status, .. } => is_path_status(*status),
            _ => false,
        }
    }

    /// The NVMe status, when the controller returned one.
    #[must_use]
    pub fn status(&self) -> Option<Status> {
        match self {
            HostError::Status { status, .. } | HostError::ConnectRefused { status, .. } => {
                Some(*status)
            }
            _ => None,
        }
    }

    /// Whether the status says the path's ANA state changed, so the ANA log is stale.
    #[must_use]
    pub fn is_ana_error(&self) -> bool {
        self.status().is_some_and(|s| {
            let ana = [
                Status::ANA_INACCESSIBLE,
                Status::ANA_TRANSITION,
                Status::ANA_PERSISTENT_LOSS,
            ];
            ana.iter().any(|a| a.code() == s.code())
        })
    }
}

/// Path-related statuses (NVMe Base 2.0 4.6.1.2.4 and Linux `blk_path_error`).
#[must_use]
pub fn is_path_status(status: Status) -> bool {
    status.sct() == sct::PATH
        || status.code() == Status::TRANSIENT_TRANSPORT_ERROR.code()
        || status.code() == Status::ABORTED_SQ_DELETION.code()
}

/// The payload of the `io::Error`s a [`super::MultipathNamespace`] returns for NVMe errors
/// that are not path errors.
#[derive(Debug, Clone)]
pub struct NvmeStatusError {
    /// The completion status.
    pub status: Status,
    /// The full message (namespace, command, status name).
    pub message: String,
}

impl fmt::Display for NvmeStatusError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for NvmeStatusError {}

/// The NVMe status carried by an `io::Error` from a [`super::MultipathNamespace`], if any.
#[must_use]
pub fn nvme_status(err: &io::Error) -> Option<Status> {
    err.get_ref()?
        .downcast_ref::<NvmeStatusError>()
        .map(|e| e.status)
}

/// The `io::ErrorKind` that best describes a status for callers that only look at kinds.
#[must_use]
pub fn status_kind(status: Status) -> io::ErrorKind {
    let code = status.code();
    if code == Status::RESERVATION_CONFLICT.code() || code == Status::ACCESS_DENIED.code() {
        io::ErrorKind::PermissionDenied
    } else if code == Status::LBA_OUT_OF_RANGE.code() || code == Status::INVALID_FIELD.code() {
        io::ErrorKind::InvalidInput
    } else if code == Status::NAMESPACE_WRITE_PROTECTED.code() {
        io::ErrorKind::ReadOnlyFilesystem
    } else if code == Status::CAPACITY_EXCEEDED.code() {
        io::ErrorKind::StorageFull
    } else {
        io::ErrorKind::Other
    }
}

/// A short name for a status: the specification's name, or the raw SCT/SC.
#[must_use]
pub fn status_name(status: Status) -> String {
    match status.name() {
        Some(name) => name.to_owned(),
        None => format!("SCT {:#x} SC {:#04x}", status.sct(), status.sc()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_the_error_kinds_callers_test_for() {
        let cases = [
            (
                Status::RESERVATION_CONFLICT,
                io::ErrorKind::PermissionDenied,
            ),
            (Status::LBA_OUT_OF_RANGE, io::ErrorKind::InvalidInput),
            (
                Status::NAMESPACE_WRITE_PROTECTED,
                io::ErrorKind::ReadOnlyFilesystem,
            ),
            (
                Status::CAPACITY_EXCEEDED.with_dnr(true),
                io::ErrorKind::StorageFull,
            ),
            (Status::WRITE_FAULT, io::ErrorKind::Other),
        ];
        for (status, kind) in cases {
            assert_eq!(status_kind(status), kind, "{status:?}");
        }
    }
}
