//! Declustered arrays, vdisks and pdisks in the daemon.

use anyhow::{bail, Result};

use super::{Daemon, Reporter};
use crate::rpc::{Reply, Request};

impl Daemon {
    pub(super) fn da_request(&self, request: Request, _r: &mut Reporter) -> Result<Reply> {
        bail!(
            "{}: declustered arrays are not available in this build yet",
            request_name(&request)
        )
    }
}

fn request_name(request: &Request) -> &'static str {
    match request {
        Request::DaCreate { .. } => "da create",
        Request::DaList => "da ls",
        Request::DaScrub { .. } => "da scrub",
        Request::VdiskCreate { .. } => "vdisk create",
        Request::VdiskList => "vdisk ls",
        Request::VdiskDelete { .. } => "vdisk delete",
        Request::PdiskList => "pdisk ls",
        Request::PdiskChange { .. } => "pdisk change",
        Request::PdiskReplace { .. } => "pdisk replace",
        _ => "request",
    }
}
