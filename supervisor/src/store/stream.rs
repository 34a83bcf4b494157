//! `send`/`recv`: snapshots as a byte stream (docs/store.md, "Stream").
//!
//! ```text
//! header  "RKSTREAM", version u32 LE, 0u32
//! frame   kind u8, length u32 LE, payload, blake3(kind, length, payload)[32]
//!   'M'   a snapshot begins: JSON (id, parent, kind, epoch, ..., regions)
//!   'P'   page records: region u32, page u64, what u8, hash[32], and for
//!         what = 2 the chunk: flags u32, length u32, bytes
//!         (what: 0 zero page, 1 a chunk the receiver has, 2 a chunk sent)
//!   'C'   the snapshot ends: records u64, chunks u64; the receiver commits
//!   'E'   the stream ends
//! ```
//! A receiver publishes a snapshot only at its valid 'C' frame; a stream
//! cut or damaged anywhere else publishes nothing of the snapshot in flight.

use std::collections::HashSet;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::error::StoreError;
use super::format::{Hash, PAGE, SnapshotId, VERSION, from_unix_ns, hex};
use super::manifest::{Manifest, ManifestRegion, SnapshotKind};
use super::map::MapEntry;
use super::pack::{ChunkReader, FLAG_RAW, IndexEntry};
use super::writer::{NewSnapshot, Origin};
use super::{Phase, Progress, Store};

pub const MAGIC: &[u8; 8] = b"RKSTREAM";
/// A frame larger than this is corrupt (records are batched well below).
const MAX_FRAME: u32 = 64 << 20;
const BATCH: usize = 1 << 20;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Header {
    id: SnapshotId,
    parent: Option<SnapshotId>,
    kind: SnapshotKind,
    epoch: u64,
    generation: u64,
    created_ns: u64,
    app: String,
    tags: Vec<String>,
    regions: Vec<ManifestRegion>,
}

fn stdout_path() -> PathBuf {
    PathBuf::from("<stream>")
}

fn write_io(e: std::io::Error) -> StoreError {
    if e.kind() == ErrorKind::BrokenPipe {
        return StoreError::OutputClosed {
            path: stdout_path(),
        };
    }
    super::error::io_err("write", &stdout_path(), &e)
}

fn frame(out: &mut dyn Write, kind: u8, payload: &[u8]) -> Result<(), StoreError> {
    let len = (payload.len() as u32).to_le_bytes();
    let mut h = blake3::Hasher::new();
    h.update(&[kind]);
    h.update(&len);
    h.update(payload);
    out.write_all(&[kind]).map_err(write_io)?;
    out.write_all(&len).map_err(write_io)?;
    out.write_all(payload).map_err(write_io)?;
    out.write_all(h.finalize().as_bytes()).map_err(write_io)
}

/// What a sender has already given the receiver (or knows it has).
struct Sent {
    have: HashSet<Hash>,
    last: Option<SnapshotId>,
    /// `have` holds every chunk of `last` (its chain was folded in, or it
    /// was sent folded), not only the chunks sent since.
    folded: bool,
}

/// A snapshot that lists more pages than this without changing them (see
/// `relisted_pages`) is sent after folding what the receiver holds.
const RELIST_FOLD_MIN: u64 = 256;

/// The pages of `m` that a delta would not list: all of a full snapshot's,
/// those of its regions stored whole.
fn relisted_pages(m: &Manifest, entries: &[MapEntry]) -> u64 {
    if m.kind == SnapshotKind::Full {
        return entries.len() as u64;
    }
    entries
        .iter()
        .filter(|e| m.regions.get(e.region as usize).is_some_and(|r| r.whole))
        .count() as u64
}

impl Store {
    /// Writes the stream header, then `id` (with `since`: every snapshot
    /// after `since` up to `id`, as stored, with only the chunks the
    /// receiver of `since` lacks; without: `id` folded into one full
    /// snapshot).  With `follow`, then waits for new snapshots and sends
    /// each until the output closes.
    pub fn send(
        &mut self,
        id: &SnapshotId,
        since: Option<&SnapshotId>,
        follow: bool,
        out: &mut dyn Write,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<(), StoreError> {
        let mut hdr = Vec::from(&MAGIC[..]);
        hdr.extend_from_slice(&VERSION.to_le_bytes());
        hdr.extend_from_slice(&0u32.to_le_bytes());
        out.write_all(&hdr).map_err(write_io)?;
        let mut sent = Sent {
            have: HashSet::new(),
            last: None,
            folded: false,
        };
        self.send_to(id, since, &mut sent, out, progress)?;
        out.flush().map_err(write_io)?;
        if !follow {
            return frame(out, b'E', &[]).and_then(|_| out.flush().map_err(write_io));
        }
        loop {
            std::thread::sleep(Duration::from_millis(100));
            self.refresh_packs()?;
            let last = sent.last.clone();
            for info in self.list()? {
                if last.as_ref().is_some_and(|l| &info.id <= l) {
                    continue;
                }
                let since = sent.last.clone();
                match self.send_to(&info.id, since.as_ref(), &mut sent, out, progress) {
                    // retention rewrote the chain since: send it whole
                    Err(StoreError::NotAncestor { .. }) => {
                        sent.have.clear();
                        self.send_to(&info.id, None, &mut sent, out, progress)?
                    }
                    r => r?,
                }
                out.flush().map_err(write_io)?;
            }
        }
    }

    fn send_to(
        &self,
        id: &SnapshotId,
        since: Option<&SnapshotId>,
        sent: &mut Sent,
        out: &mut dyn Write,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<(), StoreError> {
        match since {
            None => {
                let chain = self.chain(id)?;
                let folded = self.fold(&chain)?;
                let mut entries = Vec::new();
                for (r, pages) in folded.iter().enumerate() {
                    entries.extend(pages.iter().map(|&(page, h)| MapEntry {
                        region: r as u32,
                        page,
                        hash: Some(h),
                    }));
                }
                let mut m = chain[0].1.clone();
                m.kind = SnapshotKind::Full;
                for r in &mut m.regions {
                    r.whole = false;
                }
                self.send_one(&m, &entries, sent, out, progress)?;
                sent.folded = true; // every chunk of it is in `have` now
                Ok(())
            }
            Some(s) => {
                // the snapshots after `s` on `id`'s line, oldest first
                let mut line = Vec::new();
                let mut cur = self.load_manifest(id)?;
                while &cur.id != s {
                    let parent = cur.parent.clone();
                    line.push(cur);
                    match parent {
                        Some(p) if &p >= s => cur = self.load_manifest(&p)?,
                        _ => {
                            return Err(StoreError::NotAncestor {
                                path: self.manifest_path(id),
                                since: s.to_string(),
                                id: id.to_string(),
                            });
                        }
                    }
                }
                // What the receiver of `s` holds matters to a snapshot that
                // lists many pages it did not change (a full one, a big
                // region whole): folding `s`'s chain finds them, but reads
                // every map back to its full snapshot, hundreds after a
                // day of small deltas.  A delta's pages are mostly new, a
                // small whole region (the runtime's manifest) is a few
                // pages, and a chunk sent that the receiver had is only
                // bytes: for those the chain is not folded.
                if sent.last.as_ref() != Some(s) {
                    sent.folded = false;
                }
                for m in line.iter().rev() {
                    let entries = self.load_map(m)?;
                    self.check_packs(m)?;
                    if !sent.folded && relisted_pages(m, &entries) > RELIST_FOLD_MIN {
                        let chain = self.chain(s)?;
                        for pages in self.fold(&chain)? {
                            sent.have.extend(pages.into_iter().map(|(_, h)| h));
                        }
                        sent.folded = true;
                    }
                    self.send_one(m, &entries, sent, out, progress)?;
                }
                Ok(())
            }
        }
    }

    fn send_one(
        &self,
        m: &Manifest,
        entries: &[MapEntry],
        sent: &mut Sent,
        out: &mut dyn Write,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<(), StoreError> {
        let h = Header {
            id: m.id.clone(),
            parent: m.parent.clone(),
            kind: m.kind,
            epoch: m.epoch,
            generation: m.generation,
            created_ns: m.created_ns,
            app: m.app.clone(),
            tags: m.tags.clone(),
            regions: m.regions.clone(),
        };
        frame(out, b'M', &serde_json::to_vec(&h).unwrap_or_default())?;
        let mut buf = Vec::with_capacity(BATCH + 2 * PAGE);
        let mut chunk = vec![0u8; PAGE];
        let mut chunks = 0u64;
        let total = entries.len() as u64;
        for (i, e) in entries.iter().enumerate() {
            buf.extend_from_slice(&e.region.to_le_bytes());
            buf.extend_from_slice(&e.page.to_le_bytes());
            match &e.hash {
                None => {
                    buf.push(0);
                    buf.extend_from_slice(&[0u8; 32]);
                }
                Some(hash) if sent.have.contains(hash) => {
                    buf.push(1);
                    buf.extend_from_slice(hash);
                }
                Some(hash) => {
                    let loc = self
                        .index
                        .get(hash)
                        .ok_or_else(|| StoreError::MissingChunk {
                            path: self.manifest_path(&m.id),
                            hash: hex(hash),
                        })?;
                    let (path, file) = self.pack_file(loc.pack)?;
                    let n = loc.len as usize;
                    chunk.resize(n, 0);
                    file.read_exact_at(&mut chunk, loc.offset)
                        .map_err(|err| super::error::io_err("read", path, &err))?;
                    buf.push(2);
                    buf.extend_from_slice(hash);
                    buf.extend_from_slice(&(loc.flags as u32).to_le_bytes());
                    buf.extend_from_slice(&(n as u32).to_le_bytes());
                    buf.extend_from_slice(&chunk);
                    sent.have.insert(*hash);
                    chunks += 1;
                }
            }
            if buf.len() >= BATCH {
                frame(out, b'P', &buf)?;
                buf.clear();
                progress(Progress {
                    phase: Phase::Send,
                    done: i as u64 + 1,
                    total,
                });
            }
        }
        if !buf.is_empty() {
            frame(out, b'P', &buf)?;
        }
        let mut c = Vec::new();
        c.extend_from_slice(&total.to_le_bytes());
        c.extend_from_slice(&chunks.to_le_bytes());
        frame(out, b'C', &c)?;
        sent.last = Some(m.id.clone());
        Ok(())
    }

    /// Reads a stream into this store; returns the ids it published (a
    /// snapshot the store already has is skipped).  Any damage: an error,
    /// and the snapshot in flight is not published.
    pub fn recv(
        &mut self,
        input: &mut dyn Read,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<Vec<SnapshotId>, StoreError> {
        let mut r = FrameReader {
            input,
            path: PathBuf::from("<stream>"),
        };
        let mut hdr = [0u8; 16];
        r.exact(&mut hdr, "header")?;
        if &hdr[..8] != MAGIC {
            return Err(StoreError::StreamForeign {
                path: r.path.clone(),
                detail: "bad magic".into(),
            });
        }
        let version = u32::from_le_bytes(hdr[8..12].try_into().unwrap_or_default());
        if version > VERSION || version == 0 {
            return Err(StoreError::NewerVersion {
                path: r.path.clone(),
                found: version,
                supported: VERSION,
            });
        }
        let mut published = Vec::new();
        loop {
            let (kind, payload) = match r.frame()? {
                Some(f) => f,
                None => {
                    return Err(StoreError::StreamTruncated {
                        path: r.path.clone(),
                        detail: "ends without its end frame".into(),
                    });
                }
            };
            match kind {
                b'E' => return Ok(published),
                b'M' => {
                    if let Some(id) = self.recv_one(&mut r, &payload, progress)? {
                        published.push(id);
                    }
                }
                k => return Err(r.corrupt(format!("unexpected frame {:?}", k as char))),
            }
        }
    }

    fn recv_one(
        &mut self,
        r: &mut FrameReader<'_>,
        header: &[u8],
        progress: &mut dyn FnMut(Progress),
    ) -> Result<Option<SnapshotId>, StoreError> {
        let h: Header = serde_json::from_slice(header)
            .map_err(|e| r.corrupt(format!("snapshot header: {e}")))?;
        if !h.id.is_valid() || h.parent.as_ref().is_some_and(|p| !p.is_valid()) {
            return Err(r.corrupt("malformed snapshot id".into()));
        }
        let skip = self.manifest_path(&h.id).exists();
        let meta = NewSnapshot {
            parent: h.parent.clone(),
            full: h.kind == SnapshotKind::Full,
            epoch: h.epoch,
            generation: h.generation,
            app: h.app.clone(),
            tags: h.tags.clone(),
            regions: h.regions.iter().map(|x| x.meta.clone()).collect(),
            redo: None,
        };
        let mut w = if skip {
            None
        } else {
            let origin = Origin {
                id: h.id.clone(),
                created: from_unix_ns(h.created_ns),
            };
            let mut w = self.begin_as(meta, Some(origin))?;
            for (i, reg) in h.regions.iter().enumerate() {
                if reg.whole {
                    w.set_whole(i as u32)?;
                }
            }
            Some(w)
        };
        let mut reader = ChunkReader::new()?;
        let mut page = vec![0u8; PAGE];
        let (mut records, mut chunks) = (0u64, 0u64);
        loop {
            let Some((kind, p)) = r.frame()? else {
                return Err(StoreError::StreamTruncated {
                    path: r.path.clone(),
                    detail: format!("snapshot {} cut short", h.id),
                });
            };
            match kind {
                b'P' => {
                    let mut at = 0;
                    while at < p.len() {
                        let rec = p
                            .get(at..at + 45)
                            .ok_or_else(|| r.corrupt("short page record".into()))?;
                        let region = u32::from_le_bytes(rec[0..4].try_into().unwrap_or_default());
                        let pg = u64::from_le_bytes(rec[4..12].try_into().unwrap_or_default());
                        let mut hash = [0u8; 32];
                        hash.copy_from_slice(&rec[13..45]);
                        at += 45;
                        records += 1;
                        match rec[12] {
                            0 => {
                                if let Some(w) = w.as_mut() {
                                    w.put_zero(region, pg)?;
                                }
                            }
                            1 => {
                                if let Some(w) = w.as_mut() {
                                    w.put_known(region, pg, hash)?;
                                }
                            }
                            2 => {
                                let lens = p
                                    .get(at..at + 8)
                                    .ok_or_else(|| r.corrupt("short chunk record".into()))?;
                                let flags =
                                    u32::from_le_bytes(lens[0..4].try_into().unwrap_or_default());
                                let len =
                                    u32::from_le_bytes(lens[4..8].try_into().unwrap_or_default());
                                at += 8;
                                let bytes = p
                                    .get(at..at + len as usize)
                                    .ok_or_else(|| r.corrupt("short chunk".into()))?;
                                at += len as usize;
                                chunks += 1;
                                // (a chunk is kept as it came: never longer
                                // than a raw page, as the compressor makes them)
                                if flags & !FLAG_RAW != 0
                                    || len == 0
                                    || len as usize > PAGE
                                    || (flags & FLAG_RAW != 0 && len as usize != PAGE)
                                {
                                    return Err(r.corrupt("bad chunk flags or length".into()));
                                }
                                let e = IndexEntry {
                                    hash,
                                    offset: 0,
                                    len,
                                    flags,
                                };
                                reader
                                    .check_bytes(&r.path, &e, bytes, &mut page)
                                    .map_err(|err| r.corrupt(err.to_string()))?;
                                if let Some(w) = w.as_mut() {
                                    w.put_checked_chunk(region, pg, hash, bytes, flags)?;
                                }
                            }
                            _ => return Err(r.corrupt("bad page record kind".into())),
                        }
                    }
                    progress(Progress {
                        phase: Phase::Recv,
                        done: records,
                        total: 0,
                    });
                }
                b'C' => {
                    if p.len() != 16 {
                        return Err(r.corrupt("bad commit frame".into()));
                    }
                    let want_records = u64::from_le_bytes(p[0..8].try_into().unwrap_or_default());
                    let want_chunks = u64::from_le_bytes(p[8..16].try_into().unwrap_or_default());
                    if (want_records, want_chunks) != (records, chunks) {
                        return Err(r.corrupt(format!("snapshot {}: {records} records and {chunks} chunks, the sender says {want_records} and {want_chunks}", h.id)));
                    }
                    return match w {
                        Some(w) => Ok(Some(w.commit()?.id)),
                        None => Ok(None),
                    };
                }
                k => {
                    return Err(r.corrupt(format!(
                        "unexpected frame {:?} inside snapshot {}",
                        k as char, h.id
                    )));
                }
            }
        }
    }
}

struct FrameReader<'a> {
    input: &'a mut dyn Read,
    path: PathBuf,
}

impl FrameReader<'_> {
    fn corrupt(&self, detail: String) -> StoreError {
        StoreError::StreamCorrupt {
            path: self.path.clone(),
            detail,
        }
    }

    fn exact(&mut self, buf: &mut [u8], what: &str) -> Result<(), StoreError> {
        self.input.read_exact(buf).map_err(|e| match e.kind() {
            ErrorKind::UnexpectedEof => StoreError::StreamTruncated {
                path: self.path.clone(),
                detail: format!("ends inside the {what}"),
            },
            _ => super::error::io_err("read", Path::new("<stream>"), &e),
        })
    }

    /// The next frame, checked; `None` at a clean end of input.
    fn frame(&mut self) -> Result<Option<(u8, Vec<u8>)>, StoreError> {
        let mut kind = [0u8; 1];
        match self.input.read(&mut kind) {
            Ok(0) => return Ok(None),
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => return self.frame(),
            Err(e) => return Err(super::error::io_err("read", Path::new("<stream>"), &e)),
        }
        let mut len = [0u8; 4];
        self.exact(&mut len, "frame length")?;
        let n = u32::from_le_bytes(len);
        if n > MAX_FRAME {
            return Err(self.corrupt(format!("frame of {n} bytes")));
        }
        let mut payload = vec![0u8; n as usize];
        self.exact(&mut payload, "frame")?;
        let mut sum = [0u8; 32];
        self.exact(&mut sum, "frame checksum")?;
        let mut h = blake3::Hasher::new();
        h.update(&kind);
        h.update(&len);
        h.update(&payload);
        if h.finalize().as_bytes() != &sum {
            return Err(self.corrupt(format!("frame {:?} checksum mismatch", kind[0] as char)));
        }
        Ok(Some((kind[0], payload)))
    }
}

/// What one sender has given one receiver so far, for callers that send
/// snapshots one at a time over a link of their own (replication,
/// `cluster/`): the frames are the stream's, the header and the rest of the
/// link are the caller's.
pub struct SendState(Sent);

impl Default for SendState {
    fn default() -> Self {
        SendState(Sent {
            have: HashSet::new(),
            last: None,
            folded: false,
        })
    }
}

impl SendState {
    /// The last snapshot sent whole ('M' to 'C').
    pub fn last(&self) -> Option<&SnapshotId> {
        self.0.last.as_ref()
    }
}

/// The stream's header (magic, version).
pub fn write_header(out: &mut dyn Write) -> Result<(), StoreError> {
    let mut hdr = Vec::from(&MAGIC[..]);
    hdr.extend_from_slice(&VERSION.to_le_bytes());
    hdr.extend_from_slice(&0u32.to_le_bytes());
    out.write_all(&hdr).map_err(write_io)
}

/// Reads and checks the stream's header.
pub fn read_header(input: &mut dyn Read) -> Result<(), StoreError> {
    let mut r = FrameReader {
        input,
        path: stdout_path(),
    };
    let mut hdr = [0u8; 16];
    r.exact(&mut hdr, "header")?;
    if &hdr[..8] != MAGIC {
        return Err(StoreError::StreamForeign {
            path: r.path.clone(),
            detail: "bad magic".into(),
        });
    }
    let version = u32::from_le_bytes(hdr[8..12].try_into().unwrap_or_default());
    if version > VERSION || version == 0 {
        return Err(StoreError::NewerVersion {
            path: r.path.clone(),
            found: version,
            supported: VERSION,
        });
    }
    Ok(())
}

/// One checksummed frame (kind, length, payload, blake3).
pub fn write_frame(out: &mut dyn Write, kind: u8, payload: &[u8]) -> Result<(), StoreError> {
    frame(out, kind, payload)
}

/// The next frame, its checksum checked; `None` at a clean end of input.
pub fn read_frame(input: &mut dyn Read) -> Result<Option<(u8, Vec<u8>)>, StoreError> {
    FrameReader {
        input,
        path: stdout_path(),
    }
    .frame()
}

impl Store {
    /// Sends `id` as 'M' .. 'C' frames: with `since`, every snapshot after
    /// it on `id`'s line, as stored (retention rewrote the line: `id`
    /// folded, whole); without, `id` folded into one full snapshot.
    pub fn send_snapshot(
        &mut self,
        id: &SnapshotId,
        since: Option<&SnapshotId>,
        state: &mut SendState,
        out: &mut dyn Write,
    ) -> Result<(), StoreError> {
        self.refresh_packs()?;
        let mut quiet = |_: Progress| {};
        match self.send_to(id, since, &mut state.0, out, &mut quiet) {
            Err(StoreError::NotAncestor { .. }) => {
                state.0.have.clear();
                self.send_to(id, None, &mut state.0, out, &mut quiet)
            }
            r => r,
        }
    }

    /// Receives one snapshot whose 'M' frame (`header`) was just read from
    /// `input`, up to its 'C'; publishes it then (None: the store had it).
    /// A delta whose parent this store lacks is refused (`missing_parent`):
    /// a gap is never applied.
    pub fn recv_snapshot(
        &mut self,
        input: &mut dyn Read,
        header: &[u8],
    ) -> Result<Option<SnapshotId>, StoreError> {
        let mut r = FrameReader {
            input,
            path: stdout_path(),
        };
        self.recv_one(&mut r, header, &mut |_| {})
    }
}
