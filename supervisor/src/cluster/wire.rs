//! The replication connection (docs/failover.md, "Replication protocol"):
//! the snapshot stream's framing (store/stream.rs: kind, length, payload,
//! blake3) in both directions, with control frames of its own.
//!
//! ```text
//! standby -> primary  'J' join   {node, lineage, have}   once, first
//! primary -> standby  header "RKSTREAM" v1, then
//!                     'W' welcome {node, epoch, full}    once
//!                     'M' 'P'.. 'C'                      each snapshot, as `rekindle send`
//!                     'H' heartbeat {epoch, newest}      when idle, every HEARTBEAT
//! standby -> primary  'A' ack {epoch, id}                after each snapshot it published, and each heartbeat
//! ```
//!
//! Every frame is checksummed; a frame of a kind the reader does not expect
//! at that point ends the connection with `unexpected_frame`, and nothing of
//! a snapshot in flight is published.

use std::io::{Read, Write};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::error::ClusterError;
use crate::store::stream;

pub const JOIN: u8 = b'J';
pub const WELCOME: u8 = b'W';
pub const HEARTBEAT: u8 = b'H';
pub const ACK: u8 = b'A';
pub const SNAPSHOT: u8 = b'M';

/// How often an idle primary sends a heartbeat.
pub const HEARTBEAT_EVERY: Duration = Duration::from_millis(25);
/// A primary silent this long is gone, for its standby (40 heartbeats).
pub const SILENCE: Duration = Duration::from_millis(1000);
/// A standby silent this long is gone, for the primary: longer, because a
/// standby publishing a large snapshot acknowledges nothing meanwhile (a
/// sync primary's replies simply wait).
pub const ACK_SILENCE: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Join {
    pub node: String,
    /// The term the standby's store belongs to (lineage.rs).
    pub lineage: u64,
    /// Its newest snapshot.
    pub have: Option<String>,
    /// Its newest line's snapshots whose term it knows, newest first, with
    /// that term (lineage.rs; at most lineage::OFFERED): a primary of a
    /// newer term resumes it from the newest one both hold.
    #[serde(default)]
    pub chain: Vec<super::lineage::Labeled>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Welcome {
    pub node: String,
    pub epoch: u64,
    /// The standby must start a new store: the first snapshot is whole.
    pub full: bool,
    /// Not full: the snapshot the stream continues from.  When it is older
    /// than the standby's newest (a primary of a newer term), the standby
    /// drops its snapshots after it first.  None: from `have`.
    #[serde(default)]
    pub base: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Heartbeat {
    pub epoch: u64,
    /// The primary's newest committed snapshot.
    pub newest: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Ack {
    pub epoch: u64,
    /// The newest snapshot the standby has published.
    pub id: Option<String>,
}

pub fn send<T: Serialize>(out: &mut dyn Write, kind: u8, msg: &T) -> Result<(), ClusterError> {
    let body = serde_json::to_vec(msg).unwrap_or_default();
    stream::write_frame(out, kind, &body)?;
    out.flush()
        .map_err(|e| ClusterError::io("replication: flush", e))
}

pub fn parse<T: for<'a> Deserialize<'a>>(peer: &str, payload: &[u8]) -> Result<T, ClusterError> {
    serde_json::from_slice(payload).map_err(|e| ClusterError::Peer {
        peer: peer.to_string(),
        detail: format!("malformed control frame: {e}"),
    })
}

/// A connection's reading half that remembers a read timeout (the store's
/// errors keep only the text of an I/O error): a timeout is the peer's
/// silence, not damage.
pub struct PeerReader<R: Read> {
    pub inner: R,
    pub timed_out: bool,
}

impl<R: Read> Read for PeerReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let r = self.inner.read(buf);
        if let Err(e) = &r
            && matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            )
        {
            self.timed_out = true;
        }
        r
    }
}

/// The next frame; the end of input is an error (a peer leaves by closing
/// mid-conversation only when it dies or is fenced).
pub fn next<R: Read>(peer: &str, input: &mut PeerReader<R>) -> Result<(u8, Vec<u8>), ClusterError> {
    input.timed_out = false;
    match stream::read_frame(input) {
        Ok(Some(f)) => Ok(f),
        Ok(None) => Err(ClusterError::Peer {
            peer: peer.to_string(),
            detail: "closed the connection".into(),
        }),
        Err(_) if input.timed_out => Err(ClusterError::Silent {
            peer: peer.to_string(),
        }),
        Err(e) => Err(e.into()),
    }
}
