//! Location indexes: one snapshot's folded page table, page -> (chunk hash,
//! pack, offset, length), in one file `snapshots/<id>.loc`, so that a
//! restore need not fold the chain's maps nor read the packs' indexes.
//! The snapshot engine writes one for its newest snapshot, off the app's
//! path, after the commit (snapshot/engine.rs); it is an accelerator, not
//! part of the snapshot: a snapshot exists without one, and a restore that
//! finds none usable folds as before, saying why (`Reason`).
//!
//! ```text
//! header   16 B  "RKLOCIX\0", version u32 LE, 0u32
//! manifest 32 B  blake3 of the snapshot's manifest file, all of it
//! counts    8 B  packs u32, regions u32
//! packs          per pack: name length u16, name, file size u64
//! regions        per region: entry count u64
//! entries  56 B  per region in order, sorted by page: page u64, hash[32],
//!                offset u64, pack u32 (into the list above), len u16, flags u16
//! trailer  32 B  blake3 of every byte before it
//! ```
//! The manifest's checksum binds the index to one version of one snapshot
//! (gc's rewrite of a snapshot into a full one makes its index stale); the
//! packs' names and sizes bind it to the files it points into.  Chunks are
//! still checked against their hash when read, as on any restore.

use std::path::{Path, PathBuf};

use super::error::{StoreError, io_at};
use super::format::{Hash, PAGE};

pub const MAGIC: &[u8; 8] = b"RKLOCIX\0";
pub const VERSION: u32 = 1;
pub const SUFFIX: &str = ".loc";
const HEADER_LEN: usize = 16;
const ENTRY_LEN: usize = 56;
const TRAILER_LEN: usize = 32;

/// One present page: its chunk and where it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocEntry {
    pub page: u64,
    pub hash: Hash,
    pub offset: u64,
    /// Into `LocIndex::packs`.
    pub pack: u32,
    pub len: u16,
    pub flags: u16,
}

/// A decoded index (structure and checksum checked; its fit to the store
/// is checked by the reader, which knows the manifest and the packs).
/// `T`: what each entry is decoded into (the reader's own slot type, so
/// that millions of entries are not copied twice).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocIndex<T = LocEntry> {
    pub manifest_sum: [u8; 32],
    /// (file name in `packs/`, its size in bytes)
    pub packs: Vec<(String, u64)>,
    /// Per region of the manifest, sorted by page.
    pub regions: Vec<Vec<T>>,
}

/// How a restore found its pages' chunks: through an index, or why not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// An index of the snapshot, or of an ancestor and the deltas after it.
    Used,
    /// No snapshot of the chain has an index.
    Missing,
    /// Fails its checksum or its structure (torn, flipped bits, a bug).
    Corrupt,
    /// Shorter than its header and trailer.
    Truncated,
    /// Not an index (magic).
    Foreign,
    /// Written by a newer rekindle.
    NewerVersion,
    /// Of another version of the snapshot's manifest (gc rewrote it).
    Stale,
    /// A pack it points into is missing or not the size it was.
    PackChanged,
    /// Could not be read (permissions, I/O).
    Unreadable,
}

impl Reason {
    pub fn code(self) -> &'static str {
        match self {
            Reason::Used => "index_used",
            Reason::Missing => "index_missing",
            Reason::Corrupt => "index_corrupt",
            Reason::Truncated => "index_truncated",
            Reason::Foreign => "index_foreign",
            Reason::NewerVersion => "index_newer_version",
            Reason::Stale => "index_stale",
            Reason::PackChanged => "index_pack_changed",
            Reason::Unreadable => "index_unreadable",
        }
    }
}

/// Why an index was not used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    pub reason: Reason,
    pub path: PathBuf,
    pub detail: String,
}

impl Rejected {
    pub fn new(reason: Reason, path: &Path, detail: impl Into<String>) -> Rejected {
        Rejected {
            reason,
            path: path.to_path_buf(),
            detail: detail.into(),
        }
    }

    /// As a store error (for `verify`).
    pub fn to_store_error(&self) -> StoreError {
        StoreError::IndexCorrupt {
            path: self.path.clone(),
            detail: format!("{}: {}", self.reason.code(), self.detail),
        }
    }
}

pub fn encode(
    manifest_sum: &[u8; 32],
    packs: &[(String, u64)],
    regions: &[Vec<LocEntry>],
) -> Vec<u8> {
    let n: usize = regions.iter().map(Vec::len).sum();
    let mut out = Vec::with_capacity(HEADER_LEN + 40 + packs.len() * 64 + n * ENTRY_LEN + 64);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(manifest_sum);
    out.extend_from_slice(&(packs.len() as u32).to_le_bytes());
    out.extend_from_slice(&(regions.len() as u32).to_le_bytes());
    for (name, size) in packs {
        out.extend_from_slice(&(name.len() as u16).to_le_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&size.to_le_bytes());
    }
    for r in regions {
        out.extend_from_slice(&(r.len() as u64).to_le_bytes());
    }
    for r in regions {
        for e in r {
            out.extend_from_slice(&e.page.to_le_bytes());
            out.extend_from_slice(&e.hash);
            out.extend_from_slice(&e.offset.to_le_bytes());
            out.extend_from_slice(&e.pack.to_le_bytes());
            out.extend_from_slice(&e.len.to_le_bytes());
            out.extend_from_slice(&e.flags.to_le_bytes());
        }
    }
    let sum = blake3::hash(&out);
    out.extend_from_slice(sum.as_bytes());
    out
}

/// A little-endian cursor that fails (None) past the end.
struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.b.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

/// Decodes an index: header, checksum, then structure (pack names,
/// entries sorted by page, each entry's pack in the list and length at
/// most a page).
pub fn decode(path: &Path, bytes: &[u8]) -> Result<LocIndex, Rejected> {
    decode_into(path, bytes, |e| e)
}

/// As `decode`, each entry made into a `T` by `into`.
pub fn decode_into<T>(
    path: &Path,
    bytes: &[u8],
    into: impl Fn(LocEntry) -> T,
) -> Result<LocIndex<T>, Rejected> {
    check_header(path, bytes)?;
    let (body, trailer) = bytes.split_at(bytes.len() - TRAILER_LEN);
    // the checksum on a second core while the entries are decoded: what
    // is decoded is dropped if it fails
    let (sum_ok, decoded) = std::thread::scope(|sc| {
        let sum = sc.spawn(|| blake3::hash(body).as_bytes() == trailer);
        let decoded = decode_body(path, body, into);
        (sum.join().unwrap_or(false), decoded)
    });
    checked_sum(path, sum_ok)?;
    decoded
}

/// Magic, version and the least size: a file that could be an index.
fn check_header(path: &Path, bytes: &[u8]) -> Result<(), Rejected> {
    let rej = |reason, detail: &str| Rejected::new(reason, path, detail);
    if bytes.len() < HEADER_LEN + 40 + TRAILER_LEN {
        if bytes.len() >= 8 && &bytes[..8] != MAGIC {
            return Err(rej(Reason::Foreign, "not a location index"));
        }
        return Err(rej(Reason::Truncated, &format!("{} bytes", bytes.len())));
    }
    if &bytes[..8] != MAGIC {
        return Err(rej(Reason::Foreign, "not a location index"));
    }
    let version = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
    if version > VERSION {
        return Err(rej(
            Reason::NewerVersion,
            &format!("version {version}, this rekindle reads {VERSION}"),
        ));
    }
    if version == 0 {
        return Err(rej(Reason::Corrupt, "version 0"));
    }
    Ok(())
}

fn checked_sum(path: &Path, sum_ok: bool) -> Result<(), Rejected> {
    match sum_ok {
        true => Ok(()),
        false => Err(Rejected::new(
            Reason::Corrupt,
            path,
            "checksum mismatch (torn or damaged)",
        )),
    }
}

/// The structure after the header, checksum aside.
fn decode_body<T>(
    path: &Path,
    body: &[u8],
    into: impl Fn(LocEntry) -> T,
) -> Result<LocIndex<T>, Rejected> {
    let rej = |reason, detail: &str| Rejected::new(reason, path, detail);
    let bad = |what: &str| rej(Reason::Corrupt, what);
    let mut c = Cursor {
        b: body,
        at: HEADER_LEN,
    };
    let mut manifest_sum = [0u8; 32];
    manifest_sum.copy_from_slice(c.take(32).ok_or_else(|| bad("short"))?);
    let npacks = c.u32().ok_or_else(|| bad("short"))? as usize;
    let nregions = c.u32().ok_or_else(|| bad("short"))? as usize;
    if npacks > body.len() / 10 || nregions > body.len() / 8 {
        return Err(bad("counts larger than the file"));
    }
    let mut packs = Vec::with_capacity(npacks);
    for _ in 0..npacks {
        let len = c.u16().ok_or_else(|| bad("short pack list"))? as usize;
        let name = c.take(len).ok_or_else(|| bad("short pack list"))?;
        let name = std::str::from_utf8(name).map_err(|_| bad("pack name not UTF-8"))?;
        if name.is_empty() || name.contains('/') || name.starts_with('.') {
            return Err(bad("bad pack name"));
        }
        let size = c.u64().ok_or_else(|| bad("short pack list"))?;
        packs.push((name.to_string(), size));
    }
    let mut counts = Vec::with_capacity(nregions);
    for _ in 0..nregions {
        counts.push(c.u64().ok_or_else(|| bad("short region list"))?);
    }
    let total: u64 = counts.iter().sum();
    if total.checked_mul(ENTRY_LEN as u64) != Some((body.len() - c.at) as u64) {
        return Err(bad("entry counts disagree with the file's size"));
    }
    let mut regions = Vec::with_capacity(nregions);
    for &n in &counts {
        let mut v: Vec<T> =
            vec_for_millions(n as usize).map_err(|_| bad("more entries than memory holds"))?;
        let mut last: Option<u64> = None;
        for b in c
            .take(n as usize * ENTRY_LEN)
            .unwrap_or_default()
            .chunks_exact(ENTRY_LEN)
        {
            let mut hash = [0u8; 32];
            hash.copy_from_slice(&b[8..40]);
            let e = LocEntry {
                page: u64::from_le_bytes(b[0..8].try_into().unwrap_or_default()),
                hash,
                offset: u64::from_le_bytes(b[40..48].try_into().unwrap_or_default()),
                pack: u32::from_le_bytes(b[48..52].try_into().unwrap_or_default()),
                len: u16::from_le_bytes(b[52..54].try_into().unwrap_or_default()),
                flags: u16::from_le_bytes(b[54..56].try_into().unwrap_or_default()),
            };
            if last.is_some_and(|p| p >= e.page) {
                return Err(bad("entries not sorted by page"));
            }
            last = Some(e.page);
            if e.pack as usize >= npacks || e.len == 0 || e.len as usize > PAGE {
                return Err(bad("entry with a bad pack or length"));
            }
            if e.offset
                .checked_add(e.len as u64)
                .is_none_or(|end| end > packs[e.pack as usize].1)
            {
                return Err(bad("entry beyond its pack's size"));
            }
            v.push(into(e));
        }
        regions.push(v);
    }
    Ok(LocIndex {
        manifest_sum,
        packs,
        regions,
    })
}

/// An empty Vec with room for `n` entries.  Millions of entries are tens
/// of MB of memory never touched before: its 4 KiB page faults (about 3 us
/// each in this VM) were half of a 5 M-key index's decode, so such a
/// buffer asks for transparent huge pages (512 times fewer faults).  Only
/// advice: where the kernel gives none, nothing changes.  Err: no memory
/// for `n` entries (a size read from a file is not trusted to fit).
pub(crate) fn vec_for_millions<T>(n: usize) -> Result<Vec<T>, std::collections::TryReserveError> {
    const HUGE: usize = 2 << 20;
    let mut v = Vec::new();
    v.try_reserve_exact(n)?;
    let (start, bytes) = (v.as_mut_ptr() as usize, n.saturating_mul(size_of::<T>()));
    let (lo, hi) = (
        start.next_multiple_of(HUGE),
        start.saturating_add(bytes) & !(HUGE - 1),
    );
    if bytes >= 2 * HUGE && hi > lo {
        // SAFETY: advice over whole pages inside our own allocation.
        unsafe { libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_HUGEPAGE) };
    }
    Ok(v)
}

/// Reads and decodes `path` (as `decode_into`); Ok(None) if there is no
/// such file.  Read in pieces and checksummed as it comes in: on a cold
/// disk the hash runs while the kernel reads ahead, so it costs nothing;
/// then the entries are decoded.
pub fn read<T>(path: &Path, into: impl Fn(LocEntry) -> T) -> Result<Option<LocIndex<T>>, Rejected> {
    use std::io::Read;
    const PIECE: usize = 1 << 20;
    let unreadable = |e: std::io::Error| Rejected::new(Reason::Unreadable, path, e.to_string());
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(unreadable(e)),
    };
    let len = f.metadata().map_err(unreadable)?.len() as usize;
    // a file larger than memory (not an index, or damaged) is refused,
    // not an abort
    let mut bytes: Vec<u8> = vec_for_millions(len)
        .map_err(|e| Rejected::new(Reason::Unreadable, path, format!("{len} bytes: {e}")))?;
    let body_len = len.saturating_sub(TRAILER_LEN);
    let mut sum = blake3::Hasher::new();
    while bytes.len() < len {
        let at = bytes.len();
        // into the room reserved above, without zeroing it first
        let mut piece = (&mut f).take(PIECE.min(len - at) as u64);
        let n = piece.read_to_end(&mut bytes).map_err(unreadable)?;
        if n == 0 {
            break; // shrunk under us: refused below
        }
        sum.update(&bytes[at.min(body_len)..(at + n).min(body_len)]);
    }
    check_header(path, &bytes)?;
    let (body, trailer) = bytes.split_at(bytes.len() - TRAILER_LEN);
    checked_sum(
        path,
        body.len() == body_len && sum.finalize().as_bytes() == trailer,
    )?;
    decode_body(path, body, into).map(Some)
}

/// Publishes `bytes` as `to`: written to `to`.tmp beside it, fsynced,
/// renamed, the directory fsynced.  Plain file calls, not the store's
/// counted I/O steps (store/fsio.rs): an index is not part of any
/// snapshot, and a torn one is refused by its checksum.
pub fn publish(to: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    use std::io::Write;
    let mut tmp = to.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut f = std::fs::File::create(&tmp).map_err(io_at("create", &tmp))?;
    f.write_all(bytes).map_err(io_at("write", &tmp))?;
    f.sync_all().map_err(io_at("fsync", &tmp))?;
    drop(f);
    std::fs::rename(&tmp, to).map_err(io_at("rename", to))?;
    if let Some(dir) = to.parent() {
        let d = std::fs::File::open(dir).map_err(io_at("open", dir))?;
        d.sync_all().map_err(io_at("fsync", dir))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (Vec<(String, u64)>, Vec<Vec<LocEntry>>) {
        let e = |page, b: u8, pack| LocEntry {
            page,
            hash: [b; 32],
            offset: 16 + page * 100,
            pack,
            len: 100,
            flags: 0,
        };
        let packs = vec![
            ("a.pack".to_string(), 1 << 20),
            ("b.pack".to_string(), 1 << 20),
        ];
        (
            packs,
            vec![vec![e(0, 1, 0), e(5, 2, 1)], vec![], vec![e(3, 9, 1)]],
        )
    }

    #[test]
    fn round_trips() {
        let (packs, regions) = sample();
        let b = encode(&[7u8; 32], &packs, &regions);
        let got = decode(Path::new("x.loc"), &b).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(got.manifest_sum, [7u8; 32]);
        assert_eq!(got.packs, packs);
        assert_eq!(got.regions, regions);
    }

    #[test]
    fn every_flipped_bit_and_every_truncation_is_refused() {
        let (packs, regions) = sample();
        let b = encode(&[7u8; 32], &packs, &regions);
        for i in 0..b.len() {
            for bit in [0u8, 3, 7] {
                let mut c = b.clone();
                c[i] ^= 1 << bit;
                let r = decode(Path::new("x.loc"), &c);
                assert!(r.is_err(), "flip of bit {bit} of byte {i} accepted");
            }
        }
        for n in 0..b.len() {
            let r = decode(Path::new("x.loc"), &b[..n]);
            assert!(r.is_err(), "truncation to {n} bytes accepted");
        }
    }

    /// The file path (`read`: in pieces, checksummed as it comes in)
    /// refuses what `decode` refuses, and says so by reason.
    #[test]
    fn a_read_file_is_checked_as_decoded_bytes_are() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("x.loc");
        let (_, regions) = sample();
        let packs = vec![
            ("a.pack".to_string(), 1 << 30),
            ("b.pack".to_string(), 1 << 30),
        ];
        // entries enough to span several of read's pieces
        let many: Vec<LocEntry> = (0..60_000u64)
            .map(|p| LocEntry {
                page: p,
                hash: [(p % 251) as u8; 32],
                offset: p * 100,
                pack: 0,
                len: 100,
                flags: 0,
            })
            .collect();
        let regions = vec![many, regions[1].clone(), regions[2].clone()];
        let b = encode(&[7u8; 32], &packs, &regions);
        assert!(b.len() > 3 << 20, "{} bytes: not several pieces", b.len());
        let reason = |bytes: &[u8]| {
            std::fs::write(&path, bytes).unwrap_or_else(|e| panic!("{e}"));
            read(&path, |e| e)
                .map(|r| r.map(|i| i.regions))
                .map_err(|e| e.reason)
        };
        // (compared by a flag: a failed assert_eq would print 60,000 entries)
        let same = reason(&b) == Ok(Some(regions));
        assert!(same, "the file read back differs from what was written");
        for at in [0, 20, b.len() / 2, (1 << 20) + 5, b.len() - 40, b.len() - 1] {
            let mut c = b.clone();
            c[at] ^= 0x10;
            assert!(reason(&c).is_err(), "a flip at byte {at} accepted");
        }
        assert_eq!(reason(&b[..b.len() - 1]), Err(Reason::Corrupt));
        assert_eq!(reason(&b[..10]), Err(Reason::Truncated));
        assert_eq!(reason(&[]), Err(Reason::Truncated));
        std::fs::remove_file(&path).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(reason_missing(&path), Ok(true));
    }

    fn reason_missing(path: &Path) -> Result<bool, Reason> {
        read(path, |e| e).map(|r| r.is_none()).map_err(|e| e.reason)
    }

    #[test]
    fn foreign_and_newer_files_say_so() {
        let (packs, regions) = sample();
        let mut b = encode(&[7u8; 32], &packs, &regions);
        let mut f = b.clone();
        f[..8].copy_from_slice(b"RKMAP\0\0\0");
        assert_eq!(
            decode(Path::new("x"), &f).map_err(|e| e.reason),
            Err(Reason::Foreign)
        );
        b[8] = 2;
        assert_eq!(
            decode(Path::new("x"), &b).map_err(|e| e.reason),
            Err(Reason::NewerVersion)
        );
    }

    #[test]
    fn a_valid_checksum_over_bad_entries_is_refused() {
        // unsorted pages, a pack out of range, a chunk past its pack's end:
        // written by a buggy or foreign program, checksummed correctly
        let (packs, mut regions) = sample();
        regions[0].swap(0, 1);
        let b = encode(&[0u8; 32], &packs, &regions);
        assert_eq!(
            decode(Path::new("x"), &b).map_err(|e| e.reason),
            Err(Reason::Corrupt)
        );
        let (packs, mut regions) = sample();
        regions[2][0].pack = 2;
        let b = encode(&[0u8; 32], &packs, &regions);
        assert_eq!(
            decode(Path::new("x"), &b).map_err(|e| e.reason),
            Err(Reason::Corrupt)
        );
        let (packs, mut regions) = sample();
        regions[2][0].offset = (1 << 20) - 50;
        let b = encode(&[0u8; 32], &packs, &regions);
        assert_eq!(
            decode(Path::new("x"), &b).map_err(|e| e.reason),
            Err(Reason::Corrupt)
        );
    }
}
