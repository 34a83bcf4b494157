//! The redo log's files, `DIR/redo/`: the byte stream an app writes of
//! its own changes (records: a `u32` little-endian length, then that many
//! bytes), written to disk in batches by the supervisor and read back after
//! a restore to replay what came after the snapshot.
//!
//! ```text
//! DIR/redo/<line %016x>-<first %016x>.redo
//! header  4096 B  "RKREDO\0\x01", version u32, header size u32 (4096),
//!                 line u64, first u64, created_ns u64, zeros,
//!                 blake3(bytes 0..4064)[32] in the last 32 bytes
//! batch           magic u32 0x42444552, len u32, line u64, at u64,
//!                 blake3(the 24 bytes before, then the payload)[..16],
//!                 payload (len bytes: the stream of `line` from `at`)
//! ```
//!
//! A *line* is one continuous history; its bytes have stream positions.
//! A file holds the stream of one line from `first` on, in batches back
//! to back, and is created whole (zeros, fsync'd, renamed into place), so
//! that an append changes no metadata and `fdatasync` writes data alone.
//! The data of a file ends at a batch head of zeros, at the end of the
//! file, or at a torn tail: a batch that fails its check while every byte
//! after what it claims is zero (the one write in flight when the writer
//! died or failed).  A failed batch with data after it is damage.
//!
//! A later file of a line takes over from its `first`: the files of a line
//! in order of `first` are in the order they were written, because a new
//! file at `p` first removes the line's files that start after `p` (a
//! restored app continues at the end of its last whole record, which may
//! be before the end of what reached disk: a record cut by a crash).  So
//! the stream at position `p` is in the last file whose `first <= p`, and
//! two files overlap only where the later one rewrote the earlier's tail.

use std::collections::HashMap;
use std::fs::File;
use std::io::{IoSlice, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::SystemTime;

use super::error::{StoreError, io_at};
use super::format::unix_ns;
use super::fsio;

/// The redo log's directory in a store.
pub const REDO_DIR: &str = "redo";
/// The size of a redo file (created whole, written with zeros).
pub const REDO_SEGMENT_BYTES: u64 = 64 << 20;
/// Sets the size of the redo files a process creates.
pub const REDO_SEGMENT_BYTES_ENV: &str = "REKINDLE_REDO_SEGMENT_BYTES";
const SEGMENT_MIN: u64 = 64 << 10;
const SEGMENT_MAX: u64 = 1 << 30;

pub const HEADER_BYTES: u64 = 4096;
const MAGIC: &[u8; 8] = b"RKREDO\0\x01";
pub const VERSION: u32 = 1;
/// The header's checksum covers the bytes before it.
const HEADER_SUM_AT: usize = HEADER_BYTES as usize - 32;
const BATCH_MAGIC: u32 = 0x4244_4552;
pub const BATCH_HEAD: u64 = 40;
const SUFFIX: &str = ".redo";
/// A file being created: `<name>.tmp`, renamed to `<name>` once whole.
const TMP_SUFFIX: &str = ".tmp";

/// `REKINDLE_REDO_SEGMENT_BYTES`'s value, if valid: 64 KiB to 1 GiB, a
/// multiple of 4096.
fn parse_segment_bytes(v: &str) -> Option<u64> {
    v.parse::<u64>()
        .ok()
        .filter(|n| (SEGMENT_MIN..=SEGMENT_MAX).contains(n) && n.is_multiple_of(4096))
}

/// The size of a redo file this process creates: `REDO_SEGMENT_BYTES`, or
/// `REKINDLE_REDO_SEGMENT_BYTES`.  A value out of range is said once on
/// stderr (`redo_segment_bytes_invalid`) and the default is used.
pub fn redo_segment_bytes() -> u64 {
    static BYTES: OnceLock<u64> = OnceLock::new();
    *BYTES.get_or_init(|| {
        let Ok(v) = std::env::var(REDO_SEGMENT_BYTES_ENV) else {
            return REDO_SEGMENT_BYTES;
        };
        parse_segment_bytes(&v).unwrap_or_else(|| {
            eprintln!(
                "rekindle: {REDO_SEGMENT_BYTES_ENV}={v:?} ignored (redo_segment_bytes_invalid: \
                 bytes from {SEGMENT_MIN} to {SEGMENT_MAX}, a multiple of 4096); \
                 redo files of {REDO_SEGMENT_BYTES} bytes"
            );
            REDO_SEGMENT_BYTES
        })
    })
}

fn file_name(line: u64, first: u64) -> String {
    format!("{line:016x}-{first:016x}{SUFFIX}")
}

/// `(line, first)` of a name `file_name` made.
fn parse_name(name: &str) -> Option<(u64, u64)> {
    let (l, f) = name.strip_suffix(SUFFIX)?.split_once('-')?;
    let hex = |s: &str| {
        (s.len() == 16 && s.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| u64::from_str_radix(s, 16).ok())
            .flatten()
    };
    Some((hex(l)?, hex(f)?))
}

fn corrupt(path: &Path, offset: u64, detail: impl Into<String>) -> StoreError {
    StoreError::RedoCorrupt {
        path: path.to_path_buf(),
        offset,
        detail: detail.into(),
    }
}

fn gap(path: &Path, line: u64, at: u64, detail: impl Into<String>) -> StoreError {
    StoreError::RedoGap {
        path: path.to_path_buf(),
        line,
        at,
        detail: detail.into(),
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or_default())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default())
}

/// One redo file, as its name says.
#[derive(Debug, Clone)]
struct Listed {
    line: u64,
    first: u64,
    path: PathBuf,
}

#[derive(Debug, Default)]
struct Listing {
    /// Sorted by (line, first).
    files: Vec<Listed>,
    /// `.redo` names `file_name` did not make.
    strays: Vec<PathBuf>,
    /// Files being created, or left by a creation that died: (line, path).
    temps: Vec<(u64, PathBuf)>,
}

/// What `DIR/redo` holds; an empty listing if it does not exist.
fn list(redo: &Path) -> Result<Listing, StoreError> {
    let rd = match std::fs::read_dir(redo) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Listing::default()),
        Err(e) => return Err(io_at("read", redo)(e)),
    };
    let mut out = Listing::default();
    for ent in rd {
        let ent = ent.map_err(io_at("read", redo))?;
        let Some(name) = ent.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let path = redo.join(&name);
        if let Some(stem) = name.strip_suffix(TMP_SUFFIX) {
            if let Some((line, _)) = parse_name(stem) {
                out.temps.push((line, path));
            }
        } else if let Some((line, first)) = parse_name(&name) {
            out.files.push(Listed { line, first, path });
        } else if name.ends_with(SUFFIX) {
            out.strays.push(path);
        }
    }
    out.files.sort_by_key(|f| (f.line, f.first));
    out.strays.sort();
    Ok(out)
}

fn header_bytes(line: u64, first: u64, created_ns: u64) -> Vec<u8> {
    let mut h = vec![0u8; HEADER_BYTES as usize];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&(HEADER_BYTES as u32).to_le_bytes());
    h[16..24].copy_from_slice(&line.to_le_bytes());
    h[24..32].copy_from_slice(&first.to_le_bytes());
    h[32..40].copy_from_slice(&created_ns.to_le_bytes());
    let sum = blake3::hash(&h[..HEADER_SUM_AT]);
    h[HEADER_SUM_AT..].copy_from_slice(sum.as_bytes());
    h
}

/// Checks the header of the file `path` names `(line, first)`.
fn check_header(f: &File, path: &Path, size: u64, line: u64, first: u64) -> Result<(), StoreError> {
    if size < HEADER_BYTES {
        return Err(corrupt(
            path,
            0,
            format!("{size} bytes: shorter than its header"),
        ));
    }
    let mut h = vec![0u8; HEADER_BYTES as usize];
    f.read_exact_at(&mut h, 0).map_err(io_at("read", path))?;
    if &h[..8] != MAGIC {
        return Err(StoreError::Foreign {
            path: path.to_path_buf(),
            detail: "not a redo file (no RKREDO header)".into(),
        });
    }
    // before the checksum: a newer version may lay its header out otherwise
    let version = u32_at(&h, 8);
    if version > VERSION {
        return Err(StoreError::NewerVersion {
            path: path.to_path_buf(),
            found: version,
            supported: VERSION,
        });
    }
    if blake3::hash(&h[..HEADER_SUM_AT]).as_bytes() != &h[HEADER_SUM_AT..] {
        return Err(corrupt(path, 0, "header checksum"));
    }
    let (hsize, hline, hfirst) = (u32_at(&h, 12), u64_at(&h, 16), u64_at(&h, 24));
    if version == 0 || u64::from(hsize) != HEADER_BYTES {
        return Err(corrupt(
            path,
            0,
            format!("version {version}, header size {hsize}"),
        ));
    }
    if (hline, hfirst) != (line, first) {
        return Err(corrupt(
            path,
            0,
            format!("header says line {hline:016x} from {hfirst}, the name another"),
        ));
    }
    Ok(())
}

/// What one file holds.
#[derive(Debug, Clone, Copy)]
struct FileScan {
    /// The stream position after its last good batch.
    end: u64,
    batches: u64,
    bytes: u64,
    torn: bool,
}

/// Whether `f` holds only zeros from `from` to `to`.
fn zeros_between(f: &File, path: &Path, from: u64, to: u64) -> Result<bool, StoreError> {
    let mut buf = vec![0u8; to.saturating_sub(from).min(1 << 20) as usize];
    let mut at = from;
    while at < to {
        let n = (to - at).min(buf.len() as u64) as usize;
        f.read_exact_at(&mut buf[..n], at)
            .map_err(io_at("read", path))?;
        if buf[..n].iter().any(|&b| b != 0) {
            return Ok(false);
        }
        at += n as u64;
    }
    Ok(true)
}

/// Whether a batch that passes its check starts anywhere in [from, size):
/// after a bad batch, that is data a later write put there (damage), where
/// a torn last write leaves none.
fn good_batch_after(f: &File, path: &Path, from: u64, size: u64) -> Result<bool, StoreError> {
    if from >= size {
        return Ok(false);
    }
    let mut rest = vec![0u8; (size - from) as usize];
    f.read_exact_at(&mut rest, from)
        .map_err(io_at("read", path))?;
    let magic = BATCH_MAGIC.to_le_bytes();
    let head = BATCH_HEAD as usize;
    let mut at = 0usize;
    while at + head <= rest.len() {
        let Some(i) = rest[at..rest.len() - head + 1]
            .windows(4)
            .position(|w| w == magic)
        else {
            return Ok(false);
        };
        let h = &rest[at + i..at + i + head];
        let len = u32_at(h, 4) as usize;
        if let Some(p) = rest.get(at + i + head..at + i + head + len) {
            let mut sum = blake3::Hasher::new();
            sum.update(&h[..24]);
            sum.update(p);
            if sum.finalize().as_bytes()[..16] == h[24..] {
                return Ok(true);
            }
        }
        at += i + 1;
    }
    Ok(false)
}

/// Reads and checks every batch of a file, handing each good batch's
/// stream position and payload to `sink`.
fn scan_file(
    path: &Path,
    line: u64,
    first: u64,
    mut sink: impl FnMut(u64, &[u8]),
) -> Result<FileScan, StoreError> {
    let f = File::open(path).map_err(io_at("open", path))?;
    let size = f.metadata().map_err(io_at("stat", path))?.len();
    check_header(&f, path, size, line, first)?;
    let mut s = FileScan {
        end: first,
        batches: 0,
        bytes: 0,
        torn: false,
    };
    let mut off = HEADER_BYTES;
    let mut payload = Vec::new();
    let mut head = [0u8; BATCH_HEAD as usize];
    // the writer starts a new file when fewer bytes than a head are left
    while off + BATCH_HEAD <= size {
        f.read_exact_at(&mut head, off)
            .map_err(io_at("read", path))?;
        if head.iter().all(|&b| b == 0) {
            break;
        }
        let len = u32_at(&head, 4);
        let claimed_end = off + BATCH_HEAD + u64::from(len);
        let good = u32_at(&head, 0) == BATCH_MAGIC && claimed_end <= size && {
            payload.resize(len as usize, 0);
            f.read_exact_at(&mut payload, off + BATCH_HEAD)
                .map_err(io_at("read", path))?;
            let mut h = blake3::Hasher::new();
            h.update(&head[..24]);
            h.update(&payload);
            h.finalize().as_bytes()[..16] == head[24..]
        };
        if !good {
            // the last write, cut short: only zeros after it, or (a head
            // torn across sectors, its length garbage) no good batch after
            // it anywhere in the file; every write before it was synced
            if zeros_between(&f, path, claimed_end.min(size), size)?
                || !good_batch_after(&f, path, off + 1, size)?
            {
                s.torn = true;
                break;
            }
            return Err(corrupt(
                path,
                off,
                "a batch fails its check and data follows it",
            ));
        }
        let (bline, bat) = (u64_at(&head, 8), u64_at(&head, 16));
        if bline != line {
            return Err(corrupt(
                path,
                off,
                format!("a batch of line {bline:016x} in a file of line {line:016x}"),
            ));
        }
        if bat != s.end {
            return Err(gap(
                path,
                line,
                s.end,
                format!("the batch at offset {off} starts at position {bat}"),
            ));
        }
        let Some(end) = s.end.checked_add(u64::from(len)) else {
            return Err(corrupt(path, off, "a batch runs past the last position"));
        };
        sink(s.end, &payload);
        s.end = end;
        s.batches += 1;
        s.bytes += u64::from(len);
        off = claimed_end;
    }
    Ok(s)
}

/// The file being appended to.
struct Segment {
    file: File,
    path: PathBuf,
    line: u64,
    /// The stream position its next batch starts at.
    end: u64,
    /// The file offset of its next batch.
    off: u64,
}

/// Appends the redo log of a store's lines to `DIR/redo`.
pub struct RedoWriter {
    dir: PathBuf,
    segment_bytes: u64,
    cur: Option<Segment>,
}

impl RedoWriter {
    /// Opens DIR/redo for appending (creates the directory if missing,
    /// fsyncs DIR).  Touches no existing file: the first append starts a
    /// new one.
    pub fn open(store_dir: &Path) -> Result<RedoWriter, StoreError> {
        RedoWriter::open_sized(store_dir, redo_segment_bytes())
    }

    /// `open` with files of `bytes` (a multiple of 4096, at least two
    /// pages): small files without the process-wide environment variable.
    #[cfg(test)]
    pub fn open_with_segment_bytes(store_dir: &Path, bytes: u64) -> Result<RedoWriter, StoreError> {
        if !bytes.is_multiple_of(4096) || !(2 * HEADER_BYTES..=SEGMENT_MAX).contains(&bytes) {
            return Err(StoreError::InvalidArgument {
                path: store_dir.to_path_buf(),
                detail: format!("redo files of {bytes} bytes"),
            });
        }
        RedoWriter::open_sized(store_dir, bytes)
    }

    fn open_sized(store_dir: &Path, segment_bytes: u64) -> Result<RedoWriter, StoreError> {
        let dir = store_dir.join(REDO_DIR);
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => {}
            Err(e) => return Err(io_at("mkdir", &dir)(e)),
        }
        fsio::fsync_dir(store_dir)?;
        Ok(RedoWriter {
            dir,
            segment_bytes,
            cur: None,
        })
    }

    /// Appends `bytes`, the stream of `line` from position `at`, and makes
    /// them durable (pwrite + fdatasync) before returning.  Continues the
    /// current file when `(line, at)` continues it and it has room;
    /// otherwise the rest goes to a new file.  After an error the next
    /// append starts a new file (the failed one ends in a torn tail at
    /// worst, which the new file takes over from).
    pub fn append(&mut self, line: u64, at: u64, bytes: &[u8]) -> Result<(), StoreError> {
        if bytes.is_empty() {
            return Ok(());
        }
        if line == 0 || at.checked_add(bytes.len() as u64).is_none() {
            return Err(StoreError::InvalidArgument {
                path: self.dir.clone(),
                detail: format!("redo of line {line} at {at} ({} bytes)", bytes.len()),
            });
        }
        let (mut at, mut rest) = (at, bytes);
        while !rest.is_empty() {
            // taken out: an error below leaves no current file
            let mut seg = match self.cur.take() {
                Some(s)
                    if s.line == line && s.end == at && self.segment_bytes - s.off > BATCH_HEAD =>
                {
                    s
                }
                _ => self.create(line, at)?,
            };
            let room = self.segment_bytes - seg.off - BATCH_HEAD;
            let n = (rest.len() as u64).min(room) as usize;
            let (now, later) = rest.split_at(n);
            write_batch(&mut seg, now)?;
            self.cur = Some(seg);
            at += n as u64;
            rest = later;
        }
        Ok(())
    }

    /// Creates the file of `line` from `first`: whole, durable, in place.
    fn create(&self, line: u64, first: u64) -> Result<Segment, StoreError> {
        let name = file_name(line, first);
        let path = self.dir.join(&name);
        let tmp = self.dir.join(format!("{name}{TMP_SUFFIX}"));
        let _ = std::fs::remove_file(&tmp); // a leftover of a crashed creation
        let r = self.fill(&tmp, line, first).and_then(|file| {
            self.remove_superseded(line, first)?;
            // replaces a file of the same name: one this one takes over whole
            fsio::rename(&tmp, &path)?;
            Ok(file)
        });
        let file = match r {
            Ok(f) => f,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
        };
        fsio::fsync_dir(&self.dir)?;
        Ok(Segment {
            file,
            path,
            line,
            end: first,
            off: HEADER_BYTES,
        })
    }

    /// Writes the header and zeros to `tmp` and fsyncs it.
    fn fill(&self, tmp: &Path, line: u64, first: u64) -> Result<File, StoreError> {
        let mut f = fsio::create_new(tmp)?;
        let header = header_bytes(line, first, unix_ns(SystemTime::now()));
        fsio::write_all(&mut f, tmp, &header)?;
        fsio::step("redo-zero", tmp);
        let zeros = vec![0u8; (1 << 20).min(self.segment_bytes as usize)];
        let mut left = self.segment_bytes - HEADER_BYTES;
        while left > 0 {
            let n = left.min(zeros.len() as u64) as usize;
            f.write_all(&zeros[..n]).map_err(io_at("write", tmp))?;
            left -= n as u64;
        }
        fsio::fsync(&f, tmp)?;
        Ok(f)
    }

    /// Removes the files of `line` that start after `first`, durably, before
    /// the file from `first` appears: the order of `first` stays the order
    /// of writing, and no read ever splices the new stream with the old.
    fn remove_superseded(&self, line: u64, first: u64) -> Result<(), StoreError> {
        let old: Vec<PathBuf> = list(&self.dir)?
            .files
            .into_iter()
            .filter(|f| f.line == line && f.first > first)
            .map(|f| f.path)
            .collect();
        if old.is_empty() {
            return Ok(());
        }
        for p in &old {
            unlink_if_there(p)?;
        }
        fsio::fsync_dir(&self.dir)
    }
}

/// Unlinks `path`; one already gone is no error.
fn unlink_if_there(path: &Path) -> Result<(), StoreError> {
    match fsio::unlink(path) {
        Err(StoreError::NotFound { .. }) => Ok(()),
        r => r,
    }
}

/// Writes one batch at the segment's end and fdatasyncs it.
fn write_batch(seg: &mut Segment, payload: &[u8]) -> Result<(), StoreError> {
    let mut head = [0u8; BATCH_HEAD as usize];
    head[..4].copy_from_slice(&BATCH_MAGIC.to_le_bytes());
    // the caller keeps a batch within a file, at most 1 GiB
    head[4..8].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    head[8..16].copy_from_slice(&seg.line.to_le_bytes());
    head[16..24].copy_from_slice(&seg.end.to_le_bytes());
    let mut h = blake3::Hasher::new();
    h.update(&head[..24]);
    h.update(payload);
    head[24..].copy_from_slice(&h.finalize().as_bytes()[..16]);
    fsio::step("redo-write", &seg.path);
    pwrite_two(&seg.file, &head, payload, seg.off).map_err(io_at("write", &seg.path))?;
    fsio::step("redo-fdatasync", &seg.path);
    seg.file
        .sync_data()
        .map_err(io_at("fdatasync", &seg.path))?;
    seg.off += BATCH_HEAD + payload.len() as u64;
    seg.end += payload.len() as u64;
    Ok(())
}

/// Writes `a` then `b` at `off` in one pwritev (no copy of the payload),
/// finishing a short write piecewise.
fn pwrite_two(f: &File, a: &[u8], b: &[u8], off: u64) -> std::io::Result<()> {
    let n = loop {
        match nix::sys::uio::pwritev(f, &[IoSlice::new(a), IoSlice::new(b)], off as i64) {
            Ok(n) => break n,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    if n < a.len() {
        f.write_all_at(&a[n..], off + n as u64)?;
        f.write_all_at(b, off + a.len() as u64)
    } else {
        f.write_all_at(&b[n - a.len()..], off + n as u64)
    }
}

/// The stream of one line, read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedoStream {
    pub line: u64,
    pub from: u64,
    /// The end of the last whole record (`from` if there is none).
    pub end: u64,
    /// The whole records in `bytes`.
    pub records: u64,
    /// The stream from `from` to `end`.
    pub bytes: Vec<u8>,
}

/// The stream of `line` from position `from` (a record boundary) to the
/// end of what the files hold, every batch of the files it comes from
/// checked; a record cut by the end of the data is dropped.  No files, or
/// data that ends at or before `from` (the snapshot is ahead of what
/// reached disk): empty, `end == from`.
pub fn read_stream(store_dir: &Path, line: u64, from: u64) -> Result<RedoStream, StoreError> {
    let files: Vec<Listed> = list(&store_dir.join(REDO_DIR))?
        .files
        .into_iter()
        .filter(|f| f.line == line)
        .collect();
    let mut out = RedoStream {
        line,
        from,
        end: from,
        records: 0,
        bytes: Vec::new(),
    };
    // `from` is in the last file that starts at or before it (later ones
    // take over from their first)
    let Some(k) = files.iter().rposition(|f| f.first <= from) else {
        return match files.first() {
            None => Ok(out),
            Some(f) => Err(gap(
                &f.path,
                line,
                from,
                format!("position {from} is below the line's first, {}", f.first),
            )),
        };
    };
    let mut data_end = from;
    for (i, f) in files.iter().enumerate().skip(k) {
        let next = files.get(i + 1);
        let lo = from.max(f.first);
        let hi = next.map_or(u64::MAX, |n| n.first);
        let bytes = &mut out.bytes;
        let s = scan_file(&f.path, line, f.first, |at, p| {
            let a = at.max(lo);
            let b = (at + p.len() as u64).min(hi);
            if a < b {
                bytes.extend_from_slice(&p[(a - at) as usize..(b - at) as usize]);
            }
        })?;
        match next {
            Some(n) if s.end < n.first => {
                return Err(gap(
                    &n.path,
                    line,
                    s.end,
                    format!("positions {} to {} are in no file", s.end, n.first),
                ));
            }
            Some(n) => data_end = n.first,
            None => data_end = s.end,
        }
    }
    if data_end <= from {
        out.bytes.clear();
        return Ok(out);
    }
    // whole records only: the last may have been cut by the end of the data
    let b = &out.bytes;
    let mut p = 0usize;
    while let Some(h) = b.get(p..p + 4) {
        let n = u32_at(h, 0) as usize;
        match (p + 4).checked_add(n) {
            Some(e) if e <= b.len() => {
                p = e;
                out.records += 1;
            }
            _ => break,
        }
    }
    out.bytes.truncate(p);
    out.end = from + p as u64;
    Ok(out)
}

/// What `retain` removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetainReport {
    pub removed: u64,
    pub bytes: u64,
}

/// Removes the files no longer needed.  `keep` lists `(line, from)`: the
/// lines still needed, each from a position (a line listed twice keeps
/// the lower).  A file of a listed line goes when the line's next file
/// starts at or before `from` (all of its data that any read uses is then
/// below `from`; the last file of a line stays, as it may reach past
/// `from`).  The files of lines not listed go, and so do leftovers of
/// creations, except those of `current`, the line a writer is appending
/// to.  Then `DIR/redo` is fsync'd.
pub fn retain(
    store_dir: &Path,
    keep: &[(u64, u64)],
    current: Option<u64>,
) -> Result<RetainReport, StoreError> {
    let redo = store_dir.join(REDO_DIR);
    let l = list(&redo)?;
    let mut from: HashMap<u64, u64> = HashMap::new();
    for &(line, f) in keep {
        from.entry(line)
            .and_modify(|v| *v = (*v).min(f))
            .or_insert(f);
    }
    let mut doomed = Vec::new();
    for (i, f) in l.files.iter().enumerate() {
        if current == Some(f.line) {
            continue;
        }
        let gone = match from.get(&f.line) {
            None => true,
            Some(&from) => l
                .files
                .get(i + 1)
                .is_some_and(|n| n.line == f.line && n.first <= from),
        };
        if gone {
            doomed.push(&f.path);
        }
    }
    doomed.extend(
        l.temps
            .iter()
            .filter(|(line, _)| current != Some(*line))
            .map(|(_, p)| p),
    );
    let mut rep = RetainReport::default();
    for p in doomed {
        let size = std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
        unlink_if_there(p)?;
        rep.removed += 1;
        rep.bytes += size;
    }
    if rep.removed > 0 {
        fsio::fsync_dir(&redo)?;
    }
    Ok(rep)
}

/// What `verify` found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RedoVerify {
    pub files: u64,
    pub lines: u64,
    /// Good batches, and their payload bytes.
    pub batches: u64,
    pub bytes: u64,
    /// Files whose data ends in a torn tail.
    pub torn_tails: u64,
}

/// Checks every file: its name and header, every batch's checksum, that
/// batches continue each other, and that each file of a line starts at or
/// before where the one before it ends.  A torn tail is counted, not an
/// error.
pub fn verify(store_dir: &Path) -> Result<RedoVerify, StoreError> {
    let l = list(&store_dir.join(REDO_DIR))?;
    if let Some(p) = l.strays.first() {
        return Err(corrupt(p, 0, "not named <line>-<first>.redo"));
    }
    let mut v = RedoVerify::default();
    for (i, f) in l.files.iter().enumerate() {
        let s = scan_file(&f.path, f.line, f.first, |_, _| {})?;
        v.files += 1;
        v.batches += s.batches;
        v.bytes += s.bytes;
        v.torn_tails += u64::from(s.torn);
        if i == 0 || l.files[i - 1].line != f.line {
            v.lines += 1;
        }
        if let Some(n) = l.files.get(i + 1).filter(|n| n.line == f.line)
            && s.end < n.first
        {
            return Err(gap(
                &n.path,
                f.line,
                s.end,
                format!("positions {} to {} are in no file", s.end, n.first),
            ));
        }
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Small files: a header and one page of batches.
    const SEG: u64 = 2 * HEADER_BYTES;
    /// The most payload one batch of a `SEG` file holds.
    const ROOM: usize = (SEG - HEADER_BYTES - BATCH_HEAD) as usize;

    /// Records of varied lengths (some longer than a file), encoded.
    fn records(n: usize, seed: u8) -> (Vec<u8>, Vec<usize>) {
        let mut out = Vec::new();
        let mut bounds = vec![0];
        for i in 0..n {
            let len = [0, 1, 17, 300, 5000, 9000, 64][i % 7] + i;
            out.extend_from_slice(&(len as u32).to_le_bytes());
            out.extend((0..len).map(|j| (j as u8).wrapping_mul(31) ^ seed ^ i as u8));
            bounds.push(out.len());
        }
        (out, bounds)
    }

    /// Records of 100 to 299 bytes.
    fn small_records(n: usize) -> (Vec<u8>, Vec<usize>) {
        let mut out = Vec::new();
        let mut bounds = vec![0];
        for i in 0..n {
            let len = 100 + (i * 37) % 200;
            out.extend_from_slice(&(len as u32).to_le_bytes());
            out.extend((0..len).map(|j| (i + j) as u8 | 1));
            bounds.push(out.len());
        }
        (out, bounds)
    }

    /// Appends `s` from `at` in batches of the given sizes, in turn.
    fn append_in(w: &mut RedoWriter, line: u64, at: u64, s: &[u8], sizes: &[usize]) {
        let (mut p, mut k) = (0, 0);
        while p < s.len() {
            let n = sizes[k % sizes.len()].min(s.len() - p);
            w.append(line, at + p as u64, &s[p..p + n]).unwrap();
            p += n;
            k += 1;
        }
    }

    fn files_of(dir: &Path, line: u64) -> Vec<Listed> {
        let l = list(&dir.join(REDO_DIR)).unwrap();
        l.files.into_iter().filter(|f| f.line == line).collect()
    }

    fn writer(dir: &Path) -> RedoWriter {
        RedoWriter::open_with_segment_bytes(dir, SEG).unwrap()
    }

    /// The file offset of the last good batch's head in `path`.
    fn last_batch(path: &Path) -> (u64, u64) {
        let b = std::fs::read(path).unwrap();
        let mut off = HEADER_BYTES as usize;
        let mut last = None;
        while off + BATCH_HEAD as usize <= b.len() && b[off..off + 40].iter().any(|&x| x != 0) {
            let len = u32_at(&b, off + 4) as u64;
            last = Some((off as u64, len));
            off += 40 + len as usize;
        }
        last.unwrap()
    }

    #[test]
    fn appends_read_back_across_batches_and_files() {
        let d = tempfile::tempdir().unwrap();
        let (s, bounds) = records(40, 1);
        let mut w = writer(d.path());
        append_in(&mut w, 7, 100, &s, &[bounds[1], 3000, 1, 4096, 12345]);
        let files = files_of(d.path(), 7);
        assert!(
            files.len() as u64 >= s.len() as u64 / ROOM as u64,
            "{} files",
            files.len()
        );
        assert!(
            files
                .iter()
                .all(|f| std::fs::metadata(&f.path).unwrap().len() == SEG)
        );
        assert_eq!(files[0].first, 100);
        let r = read_stream(d.path(), 7, 100).unwrap();
        assert_eq!(r.end, 100 + s.len() as u64);
        assert_eq!(r.records, 40);
        assert!(r.bytes == s);
        let v = verify(d.path()).unwrap();
        assert_eq!(
            (v.files, v.lines, v.bytes, v.torn_tails),
            (files.len() as u64, 1, s.len() as u64, 0)
        );
    }

    #[test]
    fn records_span_batches_and_files_at_any_byte() {
        let d = tempfile::tempdir().unwrap();
        let (s, _) = records(21, 2);
        let mut w = writer(d.path());
        // batches of odd sizes, so that record heads are split too
        append_in(&mut w, 1, 0, &s, &[1, 2, 3, 7, 4095, 4097, 11]);
        let r = read_stream(d.path(), 1, 0).unwrap();
        assert_eq!((r.records, r.end), (21, s.len() as u64));
        assert!(r.bytes == s);
        // a file's room is used up before the next starts (less than a
        // head and a byte left)
        let files = files_of(d.path(), 1);
        assert!(files.len() > 5);
        for f in &files[..files.len() - 1] {
            let (off, len) = last_batch(&f.path);
            assert!(SEG - (off + BATCH_HEAD + len) <= BATCH_HEAD, "{:?}", f.path);
        }
    }

    #[test]
    fn a_read_from_a_middle_record_boundary() {
        let d = tempfile::tempdir().unwrap();
        let (s, bounds) = records(30, 3);
        let mut w = writer(d.path());
        append_in(&mut w, 5, 1000, &s, &[5000]);
        for k in [1, 13, 29, 30] {
            let from = 1000 + bounds[k] as u64;
            let r = read_stream(d.path(), 5, from).unwrap();
            assert_eq!(r.records, 30 - k as u64, "from record {k}");
            assert_eq!(r.end, 1000 + s.len() as u64);
            assert!(r.bytes == s[bounds[k]..], "from record {k}");
        }
    }

    #[test]
    fn a_torn_last_batch_is_dropped_and_the_data_before_read() {
        let d = tempfile::tempdir().unwrap();
        let (s, bounds) = records(3, 4);
        let mut w = writer(d.path());
        // one batch per record, all in one file
        for k in 0..3 {
            w.append(9, bounds[k] as u64, &s[bounds[k]..bounds[k + 1]])
                .unwrap();
        }
        let files = files_of(d.path(), 9);
        assert_eq!(files.len(), 1);
        let p = &files[0].path;
        let (off, len) = last_batch(p);
        let orig = std::fs::read(p).unwrap();
        assert_eq!(read_stream(d.path(), 9, 0).unwrap().records, 3);
        let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();
        for keep in [0, 1, len / 2, len - 1] {
            // the payload written only up to `keep`: the rest stayed zeros
            let mut b = orig.clone();
            b[(off + 40 + keep) as usize..(off + 40 + len) as usize].fill(0);
            assert!(b != orig);
            cases.push(("payload cut", b));
        }
        let mut b = orig.clone();
        b[(off + 40 + len / 3) as usize] ^= 0x04;
        cases.push(("payload bit", b));
        let mut b = orig.clone();
        b[off as usize + 30] ^= 0x80;
        cases.push(("checksum bit", b));
        let mut b = orig.clone();
        b[off as usize + 6] = 0x7f; // its length runs past the file
        cases.push(("length", b));
        let mut b = orig.clone();
        b[off as usize..off as usize + 40].fill(0); // the head lost, the payload written
        cases.push(("head lost", b));
        for (what, b) in cases {
            std::fs::write(p, &b).unwrap();
            let r = read_stream(d.path(), 9, 0).unwrap();
            assert_eq!((r.records, r.end), (2, bounds[2] as u64), "{what}");
            assert!(r.bytes == s[..bounds[2]], "{what}");
            let torn = verify(d.path()).unwrap().torn_tails;
            assert_eq!(torn, u64::from(what != "head lost"), "{what}");
        }
    }

    #[test]
    fn a_flipped_bit_before_another_batch_is_corruption() {
        let d = tempfile::tempdir().unwrap();
        let (s, bounds) = records(3, 5);
        let mut w = writer(d.path());
        for k in 0..3 {
            w.append(9, bounds[k] as u64, &s[bounds[k]..bounds[k + 1]])
                .unwrap();
        }
        let p = files_of(d.path(), 9)[0].path.clone();
        let mut b = std::fs::read(&p).unwrap();
        b[HEADER_BYTES as usize + 40 + 2] ^= 0x01; // the first batch's payload
        std::fs::write(&p, &b).unwrap();
        let e = read_stream(d.path(), 9, 0).unwrap_err();
        assert_eq!(e.code(), "redo_corrupt");
        assert!(matches!(e, StoreError::RedoCorrupt { offset, .. } if offset == HEADER_BYTES));
        assert_eq!(verify(d.path()).unwrap_err().code(), "redo_corrupt");
        // a bad last batch with bytes after its extent but no good batch
        // after it: a write torn across sectors (its head's length may be
        // garbage), dropped; with a good batch after it, damage
        b[HEADER_BYTES as usize + 40 + 2] ^= 0x01;
        let (off, len) = last_batch(&p);
        b[(off + 40 + len / 2) as usize] ^= 0x01;
        *b.last_mut().unwrap() = 1;
        std::fs::write(&p, &b).unwrap();
        assert_eq!(read_stream(d.path(), 9, 0).unwrap().records, 2);
        let mut head_torn = std::fs::read(&p).unwrap();
        head_torn[(off + 40 + len / 2) as usize] ^= 0x01;
        *head_torn.last_mut().unwrap() = 0;
        head_torn[off as usize..off as usize + 20].fill(0); // its first bytes never written
        std::fs::write(&p, &head_torn).unwrap();
        assert_eq!(read_stream(d.path(), 9, 0).unwrap().records, 2, "head torn");
        let mut mid = std::fs::read(&p).unwrap();
        mid[HEADER_BYTES as usize + 4] ^= 0x10; // the first batch's length: garbage
        std::fs::write(&p, &mid).unwrap();
        assert_eq!(
            read_stream(d.path(), 9, 0).unwrap_err().code(),
            "redo_corrupt",
            "a bad batch with good ones after it"
        );
    }

    #[test]
    fn a_missing_middle_file_is_a_gap() {
        let d = tempfile::tempdir().unwrap();
        let (s, _) = records(20, 6);
        let mut w = writer(d.path());
        append_in(&mut w, 3, 0, &s, &[2000]);
        let files = files_of(d.path(), 3);
        assert!(files.len() >= 3);
        std::fs::remove_file(&files[1].path).unwrap();
        let e = read_stream(d.path(), 3, 0).unwrap_err();
        assert_eq!(e.code(), "redo_gap");
        assert!(matches!(e, StoreError::RedoGap { line: 3, at, .. } if at == files[1].first));
        assert_eq!(verify(d.path()).unwrap_err().code(), "redo_gap");
        // a read from past the hole does not need it
        let r = read_stream(d.path(), 3, files[2].first);
        assert!(r.is_ok(), "{r:?}");
    }

    #[test]
    fn headers_newer_foreign_or_damaged_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let mut w = writer(d.path());
        w.append(2, 0, &[3, 0, 0, 0, 1, 2, 3]).unwrap();
        let p = files_of(d.path(), 2)[0].path.clone();
        let orig = std::fs::read(&p).unwrap();
        let rewrite = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut b = orig.clone();
            f(&mut b);
            std::fs::write(&p, &b).unwrap();
            read_stream(d.path(), 2, 0).unwrap_err().code()
        };
        let newer = |b: &mut Vec<u8>| {
            b[8..12].copy_from_slice(&2u32.to_le_bytes());
            let sum = blake3::hash(&b[..HEADER_SUM_AT]);
            b[HEADER_SUM_AT..HEADER_BYTES as usize].copy_from_slice(sum.as_bytes());
        };
        assert_eq!(rewrite(&newer), "store_newer_version");
        assert_eq!(rewrite(&|b| b[0] = b'X'), "store_foreign");
        assert_eq!(rewrite(&|b| b[33] ^= 1), "redo_corrupt");
        // a header naming another first position than the file's name
        let other = |b: &mut Vec<u8>| {
            b[24..32].copy_from_slice(&5u64.to_le_bytes());
            let sum = blake3::hash(&b[..HEADER_SUM_AT]);
            b[HEADER_SUM_AT..HEADER_BYTES as usize].copy_from_slice(sum.as_bytes());
        };
        assert_eq!(rewrite(&other), "redo_corrupt");
        std::fs::write(&p, &orig).unwrap();
        assert_eq!(read_stream(d.path(), 2, 0).unwrap().records, 1);
    }

    #[test]
    fn two_lines_side_by_side_read_back_alone() {
        let d = tempfile::tempdir().unwrap();
        let (a, ab) = records(12, 7);
        let (b, bb) = records(9, 8);
        let mut w = writer(d.path());
        // interleaved, record by record: each switch starts a new file
        for k in 0..12 {
            w.append(0xa, ab[k] as u64, &a[ab[k]..ab[k + 1]]).unwrap();
            if k < 9 {
                w.append(0xb, 50 + bb[k] as u64, &b[bb[k]..bb[k + 1]])
                    .unwrap();
            }
        }
        let ra = read_stream(d.path(), 0xa, 0).unwrap();
        let rb = read_stream(d.path(), 0xb, 50).unwrap();
        assert!(ra.bytes == a && ra.records == 12);
        assert!(rb.bytes == b && rb.records == 9);
        assert_eq!(rb.end, 50 + b.len() as u64);
        let v = verify(d.path()).unwrap();
        assert_eq!(v.lines, 2);
        assert_eq!(v.bytes, (a.len() + b.len()) as u64);
        assert!(read_stream(d.path(), 0xc, 0).unwrap().bytes.is_empty());
    }

    #[test]
    fn from_at_or_beyond_the_data_is_empty_and_below_it_a_gap() {
        let d = tempfile::tempdir().unwrap();
        let (s, _) = records(10, 9);
        let mut w = writer(d.path());
        append_in(&mut w, 4, 10, &s, &[3000]);
        let end = 10 + s.len() as u64;
        for from in [end, end + 1, end + 100_000] {
            let r = read_stream(d.path(), 4, from).unwrap();
            assert_eq!(
                (r.end, r.records, r.bytes.len()),
                (from, 0, 0),
                "from {from}"
            );
        }
        let e = read_stream(d.path(), 4, 9).unwrap_err();
        assert!(matches!(e, StoreError::RedoGap { at: 9, .. }), "{e:?}");
        // no files at all
        let e = tempfile::tempdir().unwrap();
        let r = read_stream(e.path(), 4, 77).unwrap();
        assert_eq!((r.end, r.bytes.len()), (77, 0));
    }

    #[test]
    fn a_snapshot_ahead_of_the_data_continues_past_a_hole() {
        let d = tempfile::tempdir().unwrap();
        let (s, _) = records(5, 10);
        let mut w = writer(d.path());
        w.append(6, 0, &s).unwrap();
        drop(w);
        // the app restored at 1,000,000 (its snapshot ahead of the log) and went on
        let (t, _) = records(4, 11);
        let mut w = writer(d.path());
        w.append(6, 1_000_000, &t).unwrap();
        let r = read_stream(d.path(), 6, 1_000_000).unwrap();
        assert!(r.bytes == t && r.records == 4);
        assert_eq!(read_stream(d.path(), 6, 0).unwrap_err().code(), "redo_gap");
        // once the snapshot is kept, the file below the hole goes
        let rep = retain(d.path(), &[(6, 1_000_000)], None).unwrap();
        assert!(rep.removed >= 1);
        assert!(verify(d.path()).is_ok());
    }

    #[test]
    fn retain_removes_what_no_read_needs_but_never_the_current_line() {
        let d = tempfile::tempdir().unwrap();
        let (s, bounds) = small_records(100);
        let mut w = writer(d.path());
        append_in(&mut w, 1, 0, &s, &[4000]);
        append_in(&mut w, 2, 0, &s, &[4000]);
        append_in(&mut w, 3, 0, &s, &[4000]);
        let f1 = files_of(d.path(), 1);
        let n3 = files_of(d.path(), 3).len();
        assert!(f1.len() >= 4);
        // a leftover of a creation of line 2 that died, and one of line 3
        let l2tmp = d
            .path()
            .join(REDO_DIR)
            .join(format!("{}{TMP_SUFFIX}", file_name(2, 999)));
        let l3tmp = d
            .path()
            .join(REDO_DIR)
            .join(format!("{}{TMP_SUFFIX}", file_name(3, 999)));
        std::fs::write(&l2tmp, [1u8; 10]).unwrap();
        std::fs::write(&l3tmp, [1u8; 10]).unwrap();
        // from a record inside the third file: the first two go
        let k = bounds.iter().position(|&b| b as u64 > f1[2].first).unwrap();
        let from = bounds[k] as u64;
        assert!(from < f1[3].first, "the record ends in the third file");
        let before = read_stream(d.path(), 1, from).unwrap();
        let n2 = files_of(d.path(), 2).len() as u64;
        let rep = retain(d.path(), &[(1, from), (1, u64::MAX)], Some(3)).unwrap();
        assert_eq!(rep.removed, 2 + n2 + 1);
        assert_eq!(rep.bytes, (2 + n2) * SEG + 10);
        let left: Vec<u64> = files_of(d.path(), 1).iter().map(|f| f.first).collect();
        assert_eq!(left, f1[2..].iter().map(|f| f.first).collect::<Vec<_>>());
        assert!(files_of(d.path(), 2).is_empty() && !l2tmp.exists());
        assert_eq!(files_of(d.path(), 3).len(), n3);
        assert!(l3tmp.exists());
        assert_eq!(read_stream(d.path(), 1, from).unwrap(), before);
        // again: nothing more to remove; without a current line, line 3 goes
        assert_eq!(retain(d.path(), &[(1, from)], Some(3)).unwrap().removed, 0);
        let rep = retain(d.path(), &[(1, from)], None).unwrap();
        assert_eq!(rep.removed, n3 as u64 + 1);
        // the last file of a line stays even when `from` is past its data
        retain(d.path(), &[(1, u64::MAX)], None).unwrap();
        assert_eq!(files_of(d.path(), 1).len(), 1);
    }

    #[test]
    fn verify_counts_files_lines_batches_bytes_and_torn_tails() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(verify(d.path()).unwrap(), RedoVerify::default());
        let mut w = writer(d.path());
        w.append(1, 0, &[1; 100]).unwrap();
        w.append(1, 100, &[2; 50]).unwrap();
        // more than the first file has room for: its rest in a second
        w.append(1, 150, &[3; 4000]).unwrap();
        w.append(2, 0, &[4; 10]).unwrap();
        let v = verify(d.path()).unwrap();
        let want = RedoVerify {
            files: 3,
            lines: 2,
            batches: 5,
            bytes: 4160,
            torn_tails: 0,
        };
        assert_eq!(v, want);
        // the last batch of line 2 torn
        let p = files_of(d.path(), 2)[0].path.clone();
        let mut b = std::fs::read(&p).unwrap();
        b[HEADER_BYTES as usize + 45] ^= 1;
        std::fs::write(&p, &b).unwrap();
        let v = verify(d.path()).unwrap();
        assert_eq!((v.batches, v.bytes, v.torn_tails), (4, 4150, 1));
        // a stray name is reported
        std::fs::write(d.path().join(REDO_DIR).join("x.redo"), b"").unwrap();
        assert_eq!(verify(d.path()).unwrap_err().code(), "redo_corrupt");
    }

    #[test]
    fn a_new_writer_at_the_end_starts_a_new_file_and_reads_continue() {
        let d = tempfile::tempdir().unwrap();
        let (s, _) = records(8, 13);
        let mut w = writer(d.path());
        append_in(&mut w, 8, 0, &s, &[700]);
        let n = files_of(d.path(), 8).len();
        drop(w);
        // the last file has room: continuing it is what a new writer must not do
        let (off, len) = last_batch(&files_of(d.path(), 8)[n - 1].path);
        assert!(off + 2 * BATCH_HEAD + len + 10 < SEG);
        let end = read_stream(d.path(), 8, 0).unwrap().end;
        let (t, _) = records(6, 14);
        let mut w = writer(d.path());
        w.append(8, end, &t[..10]).unwrap();
        assert_eq!(files_of(d.path(), 8).len(), n + 1);
        w.append(8, end + 10, &t[10..]).unwrap();
        let r = read_stream(d.path(), 8, 0).unwrap();
        assert_eq!(r.records, 14);
        assert!(r.bytes == [&s[..], &t[..]].concat());
        // the same writer, continuing, did not start another file for the
        // second append unless the first was full
        let files = files_of(d.path(), 8);
        assert_eq!(files[n].first, end);
        assert!(files.len() <= n + 1 + t.len() / ROOM + 1);
    }

    #[test]
    fn a_cut_record_is_dropped_and_a_writer_at_the_end_takes_over() {
        let d = tempfile::tempdir().unwrap();
        let (s, bounds) = records(6, 15);
        // all of the records but the last, and the last cut: it spans files
        let last = bounds[5];
        assert!(s.len() - last > ROOM, "the last record spans files");
        let cut = last + ROOM + 100;
        let mut w = writer(d.path());
        w.append(1, 0, &s[..cut]).unwrap();
        drop(w);
        let r = read_stream(d.path(), 1, 0).unwrap();
        assert_eq!((r.records, r.end), (5, last as u64));
        let before = files_of(d.path(), 1).len();
        assert!(files_of(d.path(), 1).iter().any(|f| f.first > last as u64));
        // the restored app goes on from the end of its last whole record
        let (t, _) = records(3, 16);
        let mut w = writer(d.path());
        w.append(1, last as u64, &t).unwrap();
        let files = files_of(d.path(), 1);
        assert!(
            files
                .iter()
                .all(|f| f.first <= last as u64 || f.first > cut as u64)
        );
        assert!(files.len() < before + 2);
        let r = read_stream(d.path(), 1, 0).unwrap();
        assert_eq!(r.records, 8);
        assert!(r.bytes == [&s[..last], &t[..]].concat());
        assert!(verify(d.path()).is_ok());
    }

    #[test]
    fn a_torn_tail_in_a_file_a_later_one_continues_is_not_an_error() {
        // what a failed append leaves: its batch torn, the next append in a new file
        let d = tempfile::tempdir().unwrap();
        let (s, bounds) = records(4, 17);
        let mut w = writer(d.path());
        for k in 0..3 {
            w.append(2, bounds[k] as u64, &s[bounds[k]..bounds[k + 1]])
                .unwrap();
        }
        let p = files_of(d.path(), 2)[0].path.clone();
        let (off, len) = last_batch(&p);
        let mut b = std::fs::read(&p).unwrap();
        b[(off + 40 + len - 1) as usize] ^= 1;
        std::fs::write(&p, &b).unwrap();
        let mut w = writer(d.path());
        w.append(2, bounds[2] as u64, &s[bounds[2]..]).unwrap();
        let r = read_stream(d.path(), 2, 0).unwrap();
        assert!(r.bytes == s && r.records == 4);
        assert_eq!(verify(d.path()).unwrap().torn_tails, 1);
    }

    #[test]
    fn a_batch_out_of_place_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let mut w = writer(d.path());
        w.append(1, 0, &[0; 8]).unwrap();
        w.append(1, 8, &[0; 8]).unwrap();
        let p = files_of(d.path(), 1)[0].path.clone();
        let orig = std::fs::read(&p).unwrap();
        // the second batch re-signed with another position, then another line
        for (at, field, want) in [(16usize, 9u64, "redo_gap"), (8, 5, "redo_corrupt")] {
            let mut b = orig.clone();
            let h = HEADER_BYTES as usize + 48;
            b[h + at..h + at + 8].copy_from_slice(&field.to_le_bytes());
            let mut hs = blake3::Hasher::new();
            hs.update(&b[h..h + 24]);
            hs.update(&b[h + 40..h + 48]);
            let sum = hs.finalize();
            b[h + 24..h + 40].copy_from_slice(&sum.as_bytes()[..16]);
            std::fs::write(&p, &b).unwrap();
            assert_eq!(read_stream(d.path(), 1, 0).unwrap_err().code(), want);
        }
    }

    #[test]
    fn a_jump_in_position_starts_a_new_file() {
        let d = tempfile::tempdir().unwrap();
        let mut w = writer(d.path());
        w.append(1, 0, &[2, 0, 0, 0, 7, 7]).unwrap();
        w.append(1, 100, &[1, 0, 0, 0, 9]).unwrap();
        let firsts: Vec<u64> = files_of(d.path(), 1).iter().map(|f| f.first).collect();
        assert_eq!(firsts, vec![0, 100]);
        let r = read_stream(d.path(), 1, 100).unwrap();
        assert_eq!(
            (r.records, r.end, &r.bytes[..]),
            (1, 105, &[1, 0, 0, 0, 9][..])
        );
        let e = read_stream(d.path(), 1, 0).unwrap_err();
        assert!(matches!(e, StoreError::RedoGap { at: 6, .. }), "{e:?}");
    }

    #[test]
    fn appends_that_are_empty_or_invalid() {
        let d = tempfile::tempdir().unwrap();
        let mut w = writer(d.path());
        w.append(1, 0, &[]).unwrap();
        assert!(files_of(d.path(), 1).is_empty());
        assert_eq!(w.append(0, 0, &[1]).unwrap_err().code(), "invalid_argument");
        assert_eq!(
            w.append(1, u64::MAX, &[1, 2]).unwrap_err().code(),
            "invalid_argument"
        );
        assert!(RedoWriter::open_with_segment_bytes(d.path(), 4096).is_err());
        assert!(RedoWriter::open(&d.path().join("absent")).is_err());
    }

    #[test]
    fn segment_bytes_from_the_environment() {
        assert_eq!(parse_segment_bytes("65536"), Some(65536));
        assert_eq!(parse_segment_bytes("1073741824"), Some(1 << 30));
        for bad in ["61440", "65537", "2147483648", "", "-4096", "64k"] {
            assert_eq!(parse_segment_bytes(bad), None, "{bad}");
        }
    }

    #[test]
    fn names_round_trip_and_others_are_not_files() {
        assert_eq!(parse_name(&file_name(0xab, 7)), Some((0xab, 7)));
        assert_eq!(
            parse_name(&file_name(u64::MAX, u64::MAX)),
            Some((u64::MAX, u64::MAX))
        );
        for bad in [
            "1-2.redo",
            "00000000000000ab-+000000000000007.redo",
            "x.redo",
        ] {
            assert_eq!(parse_name(bad), None, "{bad}");
        }
    }
}
