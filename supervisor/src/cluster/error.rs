//! What can go wrong in the cluster layer, each with a stable code (events,
//! `cluster status --json`, exit messages).

use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("etcd at {endpoints}: {detail}")]
    Etcd { endpoints: String, detail: String },
    #[error("etcd did not answer within {ms} ms ({what})")]
    EtcdTimeout { what: &'static str, ms: u64 },
    #[error("malformed record under {key}: {detail}")]
    BadRecord { key: String, detail: String },
    #[error("replication peer {peer}: {detail}")]
    Peer { peer: String, detail: String },
    #[error("replication peer {peer} is in term {theirs}, ours is {ours}")]
    StaleEpoch {
        peer: String,
        theirs: u64,
        ours: u64,
    },
    #[error("replication peer {peer} sent an unexpected frame {kind:?}")]
    UnexpectedFrame { peer: String, kind: char },
    #[error("replication peer {peer} was silent past the read timeout")]
    Silent { peer: String },
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("{what}: {err}")]
    Io {
        what: String,
        #[source]
        err: std::io::Error,
    },
}

impl ClusterError {
    pub fn code(&self) -> &'static str {
        match self {
            ClusterError::Etcd { .. } => "etcd_error",
            ClusterError::EtcdTimeout { .. } => "etcd_timeout",
            ClusterError::BadRecord { .. } => "bad_record",
            ClusterError::Peer { .. } => "peer_error",
            ClusterError::StaleEpoch { .. } => "stale_epoch",
            ClusterError::UnexpectedFrame { .. } => "unexpected_frame",
            ClusterError::Silent { .. } => "peer_silent",
            ClusterError::Store(e) => e.code(),
            ClusterError::Io { .. } => "io",
        }
    }

    pub fn io(what: impl Into<String>, err: std::io::Error) -> ClusterError {
        ClusterError::Io {
            what: what.into(),
            err,
        }
    }
}
