//! A small key-value state machine and Raft type configuration shared by the store tests.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::Cursor;
use std::path::Path;

use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};
use serde::{Deserialize, Serialize};
use tessera_cluster::store::{self, LogStore, Replicated, StateMachineStore, StoreError};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum KvCommand {
    Set { key: String, value: String },
    Delete { key: String },
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvResponse {
    pub previous: Option<String>,
}

openraft::declare_raft_types!(
    pub KvConfig:
        D = KvCommand,
        R = KvResponse,
        NodeId = u64,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<KvConfig>,
        SnapshotData = Cursor<Vec<u8>>,
);

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvState {
    pub map: BTreeMap<String, String>,
}

impl Replicated for KvState {
    type Command = KvCommand;
    type Response = KvResponse;

    fn apply(&mut self, command: &KvCommand) -> KvResponse {
        let previous = match command {
            KvCommand::Set { key, value } => self.map.insert(key.clone(), value.clone()),
            KvCommand::Delete { key } => self.map.remove(key),
        };
        KvResponse { previous }
    }
}

pub type KvLog = LogStore<KvConfig>;
pub type KvMachine = StateMachineStore<KvConfig, KvState>;

pub fn open_kv(path: &Path) -> Result<(KvLog, KvMachine), StoreError> {
    store::open::<KvConfig, KvState>(path)
}

pub fn log_id(term: u64, index: u64) -> LogId<u64> {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

pub fn set_entry(term: u64, index: u64, key: &str, value: &str) -> Entry<KvConfig> {
    let command = KvCommand::Set {
        key: key.to_string(),
        value: value.to_string(),
    };
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Normal(command),
    }
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("tokio runtime")
}
