//! The store's journal, `DIR/journal` and `DIR/journal-b`: where a snapshot the app waits for
//! (rkv `--durability sync`'s group commits) is made durable with one write
//! and one `fdatasync` on a preallocated file, instead of a pack, a map and
//! a manifest published in three fsync rounds.  Its records are folded into
//! ordinary snapshots later (`Store::fold_journal`), off the reply path, and
//! the journal is then reset.  docs/store.md, "Journal", has the rules.
//!
//! ```text
//! header  4096 B  "RKJRNL\0\0", version u32, 0u32, generation u64, blake3(the 24 bytes before)[32], zeros
//! record          "RKJREC\0\0", generation u64, seq u64, length u64,
//!                 payload (length bytes), blake3(the 32-byte head and the payload)[32]
//! payload         meta length u32, meta (JSON), entry count u64, entries:
//!                 region u32, page u64, what u8 (0 zero page, 1 chunk, 2 delta);
//!                 for 1: hash[32], flags u32, length u32, chunk bytes;
//!                 for 2: length u32, the delta (store/delta.rs) that turns
//!                 the page as the record's parent had it into this one
//! ```
//!
//! A record belongs to the journal's generation, and the first has seq 1,
//! each next one more.  Each record is followed by an end mark (32 zero
//! bytes, in the same write) where the file has room, and a reset writes
//! one after the header: a reset leaves the older records in place, and
//! new records of other sizes end inside them.  Reading stops at the first
//! record that is not the next one: zeros (the end mark) or a record of an
//! older generation are the clean end; anything else (a head that is not a
//! record's, a checksum that does not match, a length past the end, a
//! wrong seq) is a torn or damaged tail, ignored with its reason.  (Files
//! of version 1 had no end mark: there a head that is not a record's is
//! the clean end too.)  A page is a chunk, or a delta against the page
//! as the snapshot before the record had it: that one is in an earlier
//! record or in the published snapshot the journal's first record follows.
//! Every writer that publishes (a gc too) folds the journal first, so no
//! base is taken from under a record.
//!
//! There are two files, so that one takes the appends while the other's
//! records are folded in the background (fold.rs).  Their records are read
//! in the order of the files' generations: a file is appended to only
//! after its generation was made higher than the other's, and a file's
//! generation only grows.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::error::{StoreError, io_at};
use super::format::{Hash, SnapshotId};
use super::fsio;
use super::manifest::ManifestRegion;

/// The two files: appends go to one while the other is folded.
pub const JOURNAL_FILES: [&str; 2] = ["journal", "journal-b"];
/// Preallocated (written with zeros once) so that an append changes no
/// file metadata and `fdatasync` writes the data alone.
#[cfg(not(test))]
pub const JOURNAL_BYTES: u64 = 64 << 20;
/// Small in unit tests, so that filling a file takes a few records.
#[cfg(test)]
pub const JOURNAL_BYTES: u64 = 1 << 20;
/// Sets the size of the journal files a process creates (files keep the
/// size they were created with): for tests that fill them many times, and
/// for tuning.
pub const JOURNAL_BYTES_ENV: &str = "REKINDLE_JOURNAL_BYTES";

/// The size of a journal file this process creates: `JOURNAL_BYTES`, or
/// `REKINDLE_JOURNAL_BYTES` (1 MiB to 1 GiB, a multiple of 4096).  A value
/// out of range is said once on stderr (`journal_bytes_invalid`) and the
/// default is used.
pub fn journal_bytes() -> u64 {
    static BYTES: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *BYTES.get_or_init(|| {
        let Ok(v) = std::env::var(JOURNAL_BYTES_ENV) else {
            return JOURNAL_BYTES;
        };
        match v.parse::<u64>() {
            Ok(n) if (1 << 20..=JOURNAL_BYTES_MAX).contains(&n) && n % 4096 == 0 => n,
            _ => {
                eprintln!(
                    "rekindle: {JOURNAL_BYTES_ENV}={v:?} ignored (journal_bytes_invalid: \
                     bytes from 1048576 to 1073741824, a multiple of 4096); \
                     journal files of {JOURNAL_BYTES} bytes"
                );
                JOURNAL_BYTES
            }
        }
    })
}
pub const HEADER_BYTES: u64 = 4096;
const MAGIC: &[u8; 8] = b"RKJRNL\0\0";
const REC_MAGIC: &[u8; 8] = b"RKJREC\0\0";
/// 2: every record is followed by an end mark (REC_HEAD zero bytes) where
/// the file has room for it, and a reset writes one after the header.  In
/// a version 1 file, the bytes after the last record may be what a reset
/// left of older records, at any offset: there the first head that is not
/// a record's is the end of the records, not damage.
///
/// 3: a page may be a delta (what 2).  A file is written version 3 when it
/// is created or reset, and deltas go only into a version 3 file, so an
/// older reader refuses a file that may hold one (a newer version) rather
/// than read a delta as damage.
pub const VERSION: u32 = 3;
const END_MARK: usize = REC_HEAD;
const REC_HEAD: usize = 32;
const REC_SUM: usize = 32;

/// What a record says about its snapshot (the manifest's fields that are
/// known when the snapshot is taken).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordMeta {
    pub id: SnapshotId,
    pub parent: Option<SnapshotId>,
    pub full: bool,
    pub epoch: u64,
    pub generation: u64,
    pub created_ns: u64,
    pub app: String,
    pub tags: Vec<String>,
    pub regions: Vec<ManifestRegion>,
    /// Where the snapshot stands in the app's redo log, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redo: Option<super::manifest::RedoMark>,
}

/// One page of a record.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordPage {
    pub region: u32,
    pub page: u64,
    pub data: PageData,
}

/// What a record holds of a page.
#[derive(Debug, Clone, PartialEq)]
pub enum PageData {
    Zero,
    /// Its chunk, compressed as in a pack: hash, flags, bytes.
    Chunk(Hash, u32, Vec<u8>),
    /// The bytes that changed since the snapshot before (store/delta.rs).
    Delta(Vec<u8>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub seq: u64,
    pub meta: RecordMeta,
    /// Empty where the scan left them on disk (`scan_dir`, `Journal`'s
    /// opens): `PageReader` reads them back one record at a time.
    pub pages: Vec<RecordPage>,
    /// Which of JOURNAL_FILES holds it, and where.
    pub file: usize,
    pub at: u64,
    /// The pages it holds as deltas (region index, page), kept by the scan
    /// even where it leaves the pages on disk: a fold keeps those pages'
    /// content as it replays.
    pub delta_pages: Vec<(u32, u64)>,
}

/// Why reading stopped before the end of the file's records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TornReason {
    /// The record's bytes do not hash to its checksum (a write cut short,
    /// or a flipped bit).
    Checksum,
    /// Its length runs past the journal's end.
    Length,
    /// Its seq is not the next one of the generation.
    Sequence,
    /// Neither zeros nor a record head.
    Garbage,
    /// Its payload does not parse (written by a newer or broken writer).
    Payload,
}

impl TornReason {
    pub fn code(self) -> &'static str {
        match self {
            TornReason::Checksum => "journal_torn_checksum",
            TornReason::Length => "journal_torn_length",
            TornReason::Sequence => "journal_torn_sequence",
            TornReason::Garbage => "journal_torn_garbage",
            TornReason::Payload => "journal_torn_payload",
        }
    }
}

/// What reading the journal found.
#[derive(Debug, Clone, Default)]
pub struct Scan {
    pub generation: u64,
    pub records: Vec<Record>,
    /// Where the next record goes.
    pub end: u64,
    /// A torn or damaged record at `end`, ignored (with the records after it).
    pub torn: Option<TornReason>,
    /// The file's size.
    pub size: u64,
    /// Its header's format version.
    pub version: u32,
}

fn header_bytes(generation: u64) -> Vec<u8> {
    let mut h = vec![0u8; HEADER_BYTES as usize];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    h[16..24].copy_from_slice(&generation.to_le_bytes());
    let sum = blake3::hash(&h[..24]);
    h[24..56].copy_from_slice(sum.as_bytes());
    h
}

pub(super) fn corrupt(path: &Path, detail: impl Into<String>) -> StoreError {
    StoreError::JournalCorrupt {
        path: path.to_path_buf(),
        detail: detail.into(),
    }
}

/// The journal's header: its generation.
/// The file's generation and format version.
fn read_header(f: &File, path: &Path) -> Result<(u64, u32), StoreError> {
    let mut h = [0u8; 56];
    f.read_exact_at(&mut h, 0).map_err(io_at("read", path))?;
    if &h[..8] != MAGIC {
        return Err(corrupt(path, "no journal header"));
    }
    let version = u32::from_le_bytes(h[8..12].try_into().unwrap_or_default());
    if version > VERSION {
        return Err(StoreError::NewerVersion {
            path: path.to_path_buf(),
            found: version,
            supported: VERSION,
        });
    }
    if blake3::hash(&h[..24]).as_bytes() != &h[24..56] {
        return Err(corrupt(path, "header checksum"));
    }
    let generation = u64::from_le_bytes(h[16..24].try_into().unwrap_or_default());
    Ok((generation, version))
}

pub fn encode_payload(meta: &RecordMeta, pages: &[RecordPage]) -> Vec<u8> {
    let m = serde_json::to_vec(meta).unwrap_or_default();
    let mut out = Vec::with_capacity(16 + m.len() + pages.len() * 1200);
    out.extend_from_slice(&(m.len() as u32).to_le_bytes());
    out.extend_from_slice(&m);
    out.extend_from_slice(&(pages.len() as u64).to_le_bytes());
    for p in pages {
        out.extend_from_slice(&p.region.to_le_bytes());
        out.extend_from_slice(&p.page.to_le_bytes());
        match &p.data {
            PageData::Zero => out.push(0),
            PageData::Chunk(h, flags, bytes) => {
                out.push(1);
                out.extend_from_slice(h);
                out.extend_from_slice(&flags.to_le_bytes());
                out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
                out.extend_from_slice(bytes);
            }
            PageData::Delta(d) => {
                out.push(2);
                out.extend_from_slice(&(d.len() as u32).to_le_bytes());
                out.extend_from_slice(d);
            }
        }
    }
    out
}

fn take<'a>(b: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    if b.len() < n {
        return None;
    }
    let (h, t) = b.split_at(n);
    *b = t;
    Some(h)
}

fn u32_of(b: &mut &[u8]) -> Option<u32> {
    take(b, 4)
        .and_then(|s| s.try_into().ok())
        .map(u32::from_le_bytes)
}

fn u64_of(b: &mut &[u8]) -> Option<u64> {
    take(b, 8)
        .and_then(|s| s.try_into().ok())
        .map(u64::from_le_bytes)
}

pub fn decode_payload(mut b: &[u8]) -> Option<(RecordMeta, Vec<RecordPage>)> {
    let b = &mut b;
    let ml = u32_of(b)? as usize;
    let meta: RecordMeta = serde_json::from_slice(take(b, ml)?).ok()?;
    let n = u64_of(b)?;
    let mut pages = Vec::with_capacity(n.min(1 << 20) as usize);
    for _ in 0..n {
        let region = u32_of(b)?;
        let page = u64_of(b)?;
        let data = match take(b, 1)?[0] {
            0 => PageData::Zero,
            1 => {
                let h: Hash = take(b, 32)?.try_into().ok()?;
                let flags = u32_of(b)?;
                let len = u32_of(b)? as usize;
                PageData::Chunk(h, flags, take(b, len)?.to_vec())
            }
            2 => {
                let len = u32_of(b)? as usize;
                let d = take(b, len)?;
                super::delta::check(d).ok()?;
                PageData::Delta(d.to_vec())
            }
            _ => return None,
        };
        pages.push(RecordPage { region, page, data });
    }
    b.is_empty().then_some((meta, pages))
}

/// The bytes of one record.
pub fn encode_record(generation: u64, seq: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(REC_HEAD + payload.len() + REC_SUM);
    out.extend_from_slice(REC_MAGIC);
    out.extend_from_slice(&generation.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(payload);
    let sum = blake3::hash(&out);
    out.extend_from_slice(sum.as_bytes());
    out
}

/// The journal file of a store, open for appending.
pub struct Journal {
    pub path: PathBuf,
    file: File,
    /// The file's size, as created.
    pub size: u64,
    pub generation: u64,
    /// The format version of its header (VERSION once it is reset).
    pub version: u32,
    /// Where the next record goes, and its seq.
    pub end: u64,
    pub next_seq: u64,
}

/// The first journal file (the only one of a store written before there
/// were two).
pub fn path_of(dir: &Path) -> PathBuf {
    dir.join(JOURNAL_FILES[0])
}

pub fn paths_of(dir: &Path) -> [PathBuf; 2] {
    JOURNAL_FILES.map(|n| dir.join(n))
}

/// Both files' records, in the order they were written (the file of the
/// lower generation first).  A torn or damaged tail in the first ends the
/// records there: the second's were written after it.  None: no journal.
pub fn scan_dir(dir: &Path) -> Result<Option<Scan>, StoreError> {
    let mut found = Vec::new();
    for p in paths_of(dir) {
        if let Some(s) = scan_file_keeping(&p, Pages::LeaveOnDisk)? {
            found.push((p, s));
        }
    }
    if found.is_empty() {
        return Ok(None);
    }
    found.sort_by_key(|(_, s)| s.generation);
    if let [(p, a), (_, b)] = &found[..]
        && a.generation == b.generation
        && !a.records.is_empty()
        && !b.records.is_empty()
    {
        return Err(corrupt(
            p,
            "both journal files hold records of one generation",
        ));
    }
    let mut out = Scan::default();
    for (_, s) in found {
        out.generation = s.generation;
        if out.torn.is_some() {
            continue; // written after a tail that is lost
        }
        out.records.extend(s.records);
        out.torn = s.torn;
    }
    Ok(Some(out))
}

/// Reads every record of the current generation (the caller holds the
/// store's lock, or accepts a journal being appended to meanwhile).
pub fn scan_file(path: &Path) -> Result<Option<Scan>, StoreError> {
    scan_file_keeping(path, Pages::Keep)
}

/// Whether a scan keeps the records' pages in memory.  A fold reads them
/// back one record at a time instead (`PageReader`): a full file's chunks
/// are its size, 64 MiB, and the supervisor held them all while it folded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pages {
    Keep,
    LeaveOnDisk,
}

fn scan_file_keeping(path: &Path, pages: Pages) -> Result<Option<Scan>, StoreError> {
    let f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_at("open", path)(e)),
    };
    scan(&f, path, pages).map(Some)
}

/// Reads back, one record at a time, the pages a scan left on disk.
pub struct PageReader {
    dir: PathBuf,
    files: [Option<File>; 2],
}

impl PageReader {
    pub fn new(dir: &Path) -> PageReader {
        PageReader {
            dir: dir.to_path_buf(),
            files: [None, None],
        }
    }

    /// `r`'s pages: the scan's, or read again from its file, checked as
    /// the scan checked them and against the record the scan found there.
    pub fn pages<'r>(
        &mut self,
        r: &'r Record,
    ) -> Result<std::borrow::Cow<'r, [RecordPage]>, StoreError> {
        use std::borrow::Cow;
        if !r.pages.is_empty() {
            return Ok(Cow::Borrowed(&r.pages));
        }
        let path = self.dir.join(JOURNAL_FILES[r.file.min(1)]);
        let slot = &mut self.files[r.file.min(1)];
        let f = match slot {
            Some(f) => f,
            None => slot.insert(File::open(&path).map_err(io_at("open", &path))?),
        };
        let changed = || corrupt(&path, format!("record {} changed since it was read", r.seq));
        let mut head = [0u8; REC_HEAD];
        f.read_exact_at(&mut head, r.at)
            .map_err(io_at("read", &path))?;
        let seq = u64::from_le_bytes(head[16..24].try_into().unwrap_or_default());
        let len = u64::from_le_bytes(head[24..32].try_into().unwrap_or_default());
        if &head[..8] != REC_MAGIC || seq != r.seq || len > JOURNAL_BYTES_MAX {
            return Err(changed());
        }
        let total = (REC_HEAD + REC_SUM) as u64 + len;
        match read_record(f, &path, r.at, total)? {
            Ok((meta, pages)) if meta.id == r.meta.id => Ok(Cow::Owned(pages)),
            _ => Err(changed()),
        }
    }
}

/// The largest journal file (`journal_bytes`): no record is longer.
const JOURNAL_BYTES_MAX: u64 = 1 << 30;

/// The record of `total` bytes at `at`, its checksum checked and its
/// payload decoded; Err(reason) where either fails.
fn read_record(
    f: &File,
    path: &Path,
    at: u64,
    total: u64,
) -> Result<Result<(RecordMeta, Vec<RecordPage>), TornReason>, StoreError> {
    let mut buf = vec![0u8; total as usize];
    f.read_exact_at(&mut buf, at).map_err(io_at("read", path))?;
    let body = buf.len() - REC_SUM;
    if blake3::hash(&buf[..body]).as_bytes() != &buf[body..] {
        return Ok(Err(TornReason::Checksum));
    }
    Ok(decode_payload(&buf[REC_HEAD..body]).ok_or(TornReason::Payload))
}

fn scan(f: &File, path: &Path, pages_kept: Pages) -> Result<Scan, StoreError> {
    let file = JOURNAL_FILES
        .iter()
        .position(|n| path.file_name().is_some_and(|f| f == *n))
        .unwrap_or(0);
    let (generation, version) = read_header(f, path)?;
    let size = f.metadata().map_err(io_at("stat", path))?.len();
    let mut s = Scan {
        generation,
        records: Vec::new(),
        end: HEADER_BYTES,
        torn: None,
        size,
        version,
    };
    let mut head = [0u8; REC_HEAD];
    loop {
        if s.end + (REC_HEAD + REC_SUM) as u64 > size {
            return Ok(s);
        }
        f.read_exact_at(&mut head, s.end)
            .map_err(io_at("read", path))?;
        let rgen = u64::from_le_bytes(head[8..16].try_into().unwrap_or_default());
        let seq = u64::from_le_bytes(head[16..24].try_into().unwrap_or_default());
        let len = u64::from_le_bytes(head[24..32].try_into().unwrap_or_default());
        if &head[..8] != REC_MAGIC {
            // zeros: the end mark (or a file never filled this far)
            if head.iter().all(|&b| b == 0) || version < 2 {
                return Ok(s);
            }
            s.torn = Some(TornReason::Garbage);
            return Ok(s);
        }
        if rgen != 0 && rgen < generation {
            return Ok(s); // left from before the last reset
        }
        let want = s.records.len() as u64 + 1;
        if rgen != generation || seq != want {
            s.torn = Some(TornReason::Sequence);
            return Ok(s);
        }
        let total = (REC_HEAD as u64)
            .checked_add(len)
            .and_then(|t| t.checked_add(REC_SUM as u64));
        let Some(total) = total.filter(|t| s.end + t <= size) else {
            s.torn = Some(TornReason::Length);
            return Ok(s);
        };
        let (meta, pages) = match read_record(f, path, s.end, total)? {
            Ok(r) => r,
            Err(t) => {
                s.torn = Some(t);
                return Ok(s);
            }
        };
        let delta_pages = pages
            .iter()
            .filter(|p| matches!(p.data, PageData::Delta(_)))
            .map(|p| (p.region, p.page))
            .collect();
        let pages = match pages_kept {
            Pages::Keep => pages,
            Pages::LeaveOnDisk => Vec::new(),
        };
        s.records.push(Record {
            seq,
            meta,
            pages,
            file,
            at: s.end,
            delta_pages,
        });
        s.end += total;
    }
}

impl Journal {
    /// Opens the store's first journal file, creating it (preallocated,
    /// durable) if there is none.  Returns it with what it holds.
    pub fn open_or_create(dir: &Path) -> Result<(Journal, Scan), StoreError> {
        Journal::open_or_create_at(dir, &path_of(dir))
    }

    /// `open_or_create` for either file of the pair.
    pub fn open_or_create_at(dir: &Path, path: &Path) -> Result<(Journal, Scan), StoreError> {
        let path = path.to_path_buf();
        if !path.exists() {
            create(dir, &path)?;
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(io_at("open", &path))?;
        let s = scan(&file, &path, Pages::LeaveOnDisk)?;
        let j = Journal {
            path,
            file,
            size: s.size,
            generation: s.generation,
            version: s.version,
            end: s.end,
            next_seq: s.records.len() as u64 + 1,
        };
        Ok((j, s))
    }

    /// The generation on disk now (another process may have reset it).
    pub fn disk_generation(&self) -> Result<u64, StoreError> {
        read_header(&self.file, &self.path).map(|(g, _)| g)
    }

    pub fn room(&self) -> u64 {
        self.size.saturating_sub(self.end)
    }

    pub fn is_empty(&self) -> bool {
        self.next_seq == 1
    }

    /// Appends one record and makes it durable (one `fdatasync`).
    pub fn append(&mut self, payload: &[u8]) -> Result<u64, StoreError> {
        let rec = encode_record(self.generation, self.next_seq, payload);
        if rec.len() as u64 > self.room() {
            return Err(StoreError::InvalidArgument {
                path: self.path.clone(),
                detail: format!("record of {} bytes does not fit", rec.len()),
            });
        }
        // the end mark in the same write: what follows the record may be
        // a longer record of before the last reset
        let mut rec = rec;
        let mark = (self.room() - rec.len() as u64).min(END_MARK as u64) as usize;
        rec.resize(rec.len() + mark, 0);
        fsio::step("journal-write", &self.path);
        self.file
            .write_all_at(&rec, self.end)
            .map_err(io_at("write", &self.path))?;
        fsio::step("journal-fdatasync", &self.path);
        self.file
            .sync_data()
            .map_err(io_at("fdatasync", &self.path))?;
        self.end += (rec.len() - mark) as u64;
        self.next_seq += 1;
        Ok(self.next_seq - 1)
    }

    /// Empties the journal: a new generation (its records were folded).
    pub fn reset(&mut self) -> Result<(), StoreError> {
        self.reset_to(self.generation + 1)
    }

    /// Empties the journal with generation `g` (above its own, so its old
    /// records are hidden; above the other file's, so that its next
    /// records read after that file's).
    pub fn reset_to(&mut self, g: u64) -> Result<(), StoreError> {
        if g <= self.generation {
            return Err(StoreError::InvalidArgument {
                path: self.path.clone(),
                detail: format!("generation {g} is not above {}", self.generation),
            });
        }
        fsio::step("journal-reset", &self.path);
        let mut h = header_bytes(g);
        h.resize(h.len() + END_MARK, 0);
        self.file
            .write_all_at(&h, 0)
            .map_err(io_at("write", &self.path))?;
        self.file
            .sync_data()
            .map_err(io_at("fdatasync", &self.path))?;
        self.generation = g;
        self.version = VERSION;
        self.end = HEADER_BYTES;
        self.next_seq = 1;
        Ok(())
    }
}

/// Writes a zeroed journal in `tmp/`, fsyncs it, renames it into place and
/// fsyncs the directory: a journal exists whole or not at all.
fn create(dir: &Path, path: &Path) -> Result<(), StoreError> {
    let tmp_dir = dir.join(super::format::TMP);
    std::fs::create_dir_all(&tmp_dir).map_err(io_at("mkdir", &tmp_dir))?;
    let name = path.file_name().unwrap_or_default();
    let tmp = tmp_dir.join(name);
    let _ = std::fs::remove_file(&tmp);
    let mut f = fsio::create_new(&tmp)?;
    fsio::write_all(&mut f, &tmp, &header_bytes(1))?;
    let zeros = vec![0u8; 1 << 20];
    let mut left = journal_bytes() - HEADER_BYTES;
    while left > 0 {
        let n = left.min(zeros.len() as u64) as usize;
        std::io::Write::write_all(&mut f, &zeros[..n]).map_err(io_at("write", &tmp))?;
        left -= n as u64;
    }
    fsio::fsync(&f, &tmp)?;
    fsio::rename(&tmp, path)?;
    fsio::fsync_dir(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::manifest::RegionKind;
    use crate::store::manifest::RegionMeta;

    fn meta(seq: u64) -> RecordMeta {
        RecordMeta {
            id: SnapshotId(format!("{seq:012}-20261124T000000Z")),
            parent: None,
            full: false,
            epoch: seq,
            generation: 1,
            created_ns: 0,
            app: "t".into(),
            tags: vec![],
            regions: vec![ManifestRegion {
                meta: RegionMeta {
                    kind: RegionKind::Arena,
                    name: "a".into(),
                    addr: 0,
                    size: 1 << 20,
                    layout: serde_json::Value::Null,
                },
                whole: false,
            }],
            redo: None,
        }
    }

    fn page(i: u64) -> RecordPage {
        RecordPage {
            region: 0,
            page: i,
            data: PageData::Chunk([i as u8; 32], 1, vec![i as u8; 100 + i as usize]),
        }
    }

    fn three(dir: &Path) -> (Journal, Vec<u64>) {
        let (mut j, s) = Journal::open_or_create(dir).unwrap();
        assert!(s.records.is_empty() && s.torn.is_none());
        let mut ends = vec![j.end];
        for k in 1..=3 {
            j.append(&encode_payload(&meta(k), &[page(k), page(k + 10)]))
                .unwrap();
            ends.push(j.end);
        }
        (j, ends)
    }

    #[test]
    fn records_read_back_in_order() {
        let d = tempfile::tempdir().unwrap();
        let (_j, ends) = three(d.path());
        let s = scan_file(&path_of(d.path())).unwrap().unwrap();
        assert_eq!(s.records.len(), 3);
        assert_eq!(s.end, ends[3]);
        assert!(s.torn.is_none());
        assert_eq!(s.records[1].meta, meta(2));
        assert_eq!(s.records[2].pages, vec![page(3), page(13)]);
    }

    #[test]
    fn a_torn_last_record_at_every_length_keeps_the_ones_before() {
        let d = tempfile::tempdir().unwrap();
        let (_j, ends) = three(d.path());
        let p = path_of(d.path());
        let orig = std::fs::read(&p).unwrap();
        for cut in ends[2]..ends[3] {
            // the last record written only up to `cut` (the rest as before: zeros)
            let mut b = orig.clone();
            b[cut as usize..ends[3] as usize].fill(0);
            std::fs::write(&p, &b).unwrap();
            let s = scan_file(&p).unwrap().unwrap();
            assert_eq!(s.records.len(), 2, "cut at {cut}");
            assert_eq!(s.end, ends[2]);
            if cut > ends[2] {
                assert!(s.torn.is_some(), "cut at {cut}");
            }
        }
    }

    #[test]
    fn a_flipped_bit_ends_the_log_before_its_record() {
        let d = tempfile::tempdir().unwrap();
        let (_j, ends) = three(d.path());
        let p = path_of(d.path());
        let orig = std::fs::read(&p).unwrap();
        for (rec, at) in [(0usize, ends[0] + 40), (1, ends[2] - 3), (2, ends[2] + 9)] {
            let mut b = orig.clone();
            b[at as usize] ^= 0x10;
            std::fs::write(&p, &b).unwrap();
            let s = scan_file(&p).unwrap().unwrap();
            assert_eq!(s.records.len(), rec, "flip at {at}");
            assert!(s.torn.is_some());
        }
    }

    #[test]
    fn a_reset_hides_the_old_records_and_appends_anew() {
        let d = tempfile::tempdir().unwrap();
        let (mut j, _) = three(d.path());
        j.reset().unwrap();
        let s = scan_file(&j.path).unwrap().unwrap();
        assert!(s.records.is_empty() && s.torn.is_none());
        j.append(&encode_payload(&meta(9), &[page(1)])).unwrap();
        let (j2, s) = Journal::open_or_create(d.path()).unwrap();
        assert_eq!(s.records.len(), 1);
        assert_eq!(s.records[0].meta.id, meta(9).id);
        assert_eq!(j2.next_seq, 2);
        assert_eq!(j2.generation, 2);
    }

    #[test]
    fn both_files_read_in_the_order_of_their_generations() {
        let d = tempfile::tempdir().unwrap();
        let [pa, pb] = paths_of(d.path());
        let (mut b, _) = Journal::open_or_create_at(d.path(), &pb).unwrap();
        b.reset_to(5).unwrap();
        b.append(&encode_payload(&meta(1), &[page(1)])).unwrap();
        b.append(&encode_payload(&meta(2), &[page(2)])).unwrap();
        let (mut a, _) = Journal::open_or_create_at(d.path(), &pa).unwrap();
        a.reset_to(6).unwrap();
        a.append(&encode_payload(&meta(3), &[page(3)])).unwrap();
        let s = scan_dir(d.path()).unwrap().unwrap();
        let ids: Vec<_> = s.records.iter().map(|r| r.meta.epoch).collect();
        assert_eq!(ids, vec![1, 2, 3]);
        assert!(s.torn.is_none());
        // a damaged record in the older file: what the newer holds came after
        let mut bytes = std::fs::read(&pb).unwrap();
        bytes[b.end as usize - 1] ^= 1;
        std::fs::write(&pb, &bytes).unwrap();
        let s = scan_dir(d.path()).unwrap().unwrap();
        assert_eq!(s.records.len(), 1);
        assert_eq!(s.torn, Some(TornReason::Checksum));
        // one generation holding records in both files is refused
        let (mut a, _) = Journal::open_or_create_at(d.path(), &pa).unwrap();
        a.reset_to(7).unwrap();
        let (mut b, _) = Journal::open_or_create_at(d.path(), &pb).unwrap();
        b.reset_to(7).unwrap();
        a.append(&encode_payload(&meta(1), &[page(1)])).unwrap();
        b.append(&encode_payload(&meta(2), &[page(2)])).unwrap();
        assert_eq!(scan_dir(d.path()).unwrap_err().code(), "journal_corrupt");
        assert_eq!(b.reset_to(7).unwrap_err().code(), "invalid_argument");
    }

    #[test]
    fn a_damaged_header_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let (j, _) = three(d.path());
        let mut b = std::fs::read(&j.path).unwrap();
        b[17] ^= 1;
        std::fs::write(&j.path, &b).unwrap();
        let e = scan_file(&j.path).unwrap_err();
        assert_eq!(e.code(), "journal_corrupt");
    }

    fn append_pages(j: &mut Journal, seq: u64, n: u64) {
        let pages: Vec<RecordPage> = (0..n).map(page).collect();
        j.append(&encode_payload(&meta(seq), &pages)).unwrap();
    }

    #[test]
    fn after_a_reset_shorter_records_end_cleanly_and_damage_still_shows() {
        let d = tempfile::tempdir().unwrap();
        let (mut j, _) = Journal::open_or_create(d.path()).unwrap();
        for k in 1..=4 {
            append_pages(&mut j, k, 40);
        }
        j.reset().unwrap();
        // new records end inside the old ones: the end mark says so
        for k in 1..=3 {
            append_pages(&mut j, k, 7);
        }
        let end = j.end;
        let (_, s) = Journal::open_or_create(d.path()).unwrap();
        assert_eq!((s.records.len(), s.torn, s.end), (3, None, end));
        // bytes that are not a record's where the end mark was: damage
        let f = OpenOptions::new()
            .write(true)
            .open(path_of(d.path()))
            .unwrap();
        f.write_all_at(&[0x5a; 32], end).unwrap();
        let (_, s) = Journal::open_or_create(d.path()).unwrap();
        assert_eq!((s.records.len(), s.torn), (3, Some(TornReason::Garbage)));
        // the same bytes in a version 1 file are what its reset left
        let mut h = header_bytes(j.generation);
        h[8..12].copy_from_slice(&1u32.to_le_bytes());
        let sum = blake3::hash(&h[..24]);
        h[24..56].copy_from_slice(sum.as_bytes());
        f.write_all_at(&h, 0).unwrap();
        let (_, s) = Journal::open_or_create(d.path()).unwrap();
        assert_eq!((s.records.len(), s.torn), (3, None));
    }

    #[test]
    fn pages_left_on_disk_read_back_and_a_changed_record_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let (mut j, _) = Journal::open_or_create(d.path()).unwrap();
        for k in 1..=3 {
            j.append(&encode_payload(&meta(k), &[page(k), page(k + 10)]))
                .unwrap();
        }
        let s = scan_dir(d.path()).unwrap().unwrap();
        assert!(s.records.iter().all(|r| r.pages.is_empty()));
        let mut pr = PageReader::new(d.path());
        for (k, r) in (1..).zip(&s.records) {
            assert_eq!(&*pr.pages(r).unwrap(), &[page(k), page(k + 10)]);
        }
        // the second record changed after the scan: refused, not replayed
        let mut bytes = std::fs::read(&j.path).unwrap();
        bytes[s.records[1].at as usize + 40] ^= 1;
        std::fs::write(&j.path, &bytes).unwrap();
        let mut pr = PageReader::new(d.path());
        assert_eq!(pr.pages(&s.records[0]).unwrap().len(), 2);
        assert_eq!(
            pr.pages(&s.records[1]).unwrap_err().code(),
            "journal_corrupt"
        );
    }
}
