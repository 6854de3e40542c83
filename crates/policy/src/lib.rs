//! Policies of a file system [mmchpolicy, mmapplypolicy]: GPFS-style RULE statements that
//! place new files in storage pools and migrate, delete or list existing ones.
//!
//! [`Policy::parse`] checks a policy against the file system's pools, so that a policy
//! that is installed can always be applied; [`Policy::place`] is the decision at create;
//! [`Rule::matches`] and [`Rule::weight`] drive `policy apply`. Nothing here touches a
//! file system: callers pass each file's attributes as [`FileAttrs`].

mod expr;
mod rules;

pub use expr::{mode_string, FileAttrs};
pub use rules::{Action, FromPool, Policy, Rule, Threshold, POLICY_BYTES_MAX};

/// A policy that cannot be installed: where, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}, column {column}: {message}")]
pub struct PolicyError {
    pub line: u64,
    pub column: u64,
    pub message: String,
}

/// The fileset every file belongs to: Tessera has no other filesets yet.
pub const ROOT_FILESET: &str = "root";
