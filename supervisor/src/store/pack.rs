//! Pack files: the compressed page chunks one snapshot added, then an
//! index (hash -> offset, length) and a fixed trailer that locates and
//! checksums the index, so a pack's index loads without reading its chunks.
//!
//! ```text
//! header  16 B   "RKPACK\0\0", version u32 LE, 0u32
//! chunks         zstd frames (or raw 4 KiB pages that do not compress)
//! index   48 B each, sorted by hash: hash[32], offset u64, len u32, flags u32
//! trailer 64 B   "RKPKIDX\0", index offset u64, count u64, 0u64, blake3(index)[32]
//! ```

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::error::{StoreError, io_at};
use super::format::{Hash, PAGE, VERSION, hex};
use super::fsio;

pub const HEADER_MAGIC: &[u8; 8] = b"RKPACK\0\0";
pub const TRAILER_MAGIC: &[u8; 8] = b"RKPKIDX\0";
pub const HEADER_LEN: u64 = 16;
pub const ENTRY_LEN: usize = 48;
pub const TRAILER_LEN: u64 = 64;
/// flags bit: the chunk is the page itself (it did not compress)
pub const FLAG_RAW: u32 = 1;
/// Chunks are written in batches of about this many bytes.
const WRITE_BATCH: usize = 1 << 20;
/// Writeback of a pack is started every this many bytes, and the step
/// before it waited for: a 64 MiB pack (a journal file's fold) is then
/// never all dirty at its fsync, which put 60 MB in the disk's queue ahead
/// of the journal's next `fdatasync` (a 110 ms group commit).
const WRITEBACK_STEP: u64 = 4 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    pub hash: Hash,
    pub offset: u64,
    pub len: u32,
    pub flags: u32,
}

impl IndexEntry {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.hash);
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&self.flags.to_le_bytes());
    }

    fn decode(b: &[u8]) -> IndexEntry {
        let mut hash = [0u8; 32];
        hash.copy_from_slice(&b[..32]);
        IndexEntry {
            hash,
            offset: u64::from_le_bytes(b[32..40].try_into().unwrap_or_default()),
            len: u32::from_le_bytes(b[40..44].try_into().unwrap_or_default()),
            flags: u32::from_le_bytes(b[44..48].try_into().unwrap_or_default()),
        }
    }
}

/// A pack being written under `tmp/`; `finish` appends index and trailer
/// and fsyncs it; the snapshot writer then renames it into `packs/`.
pub struct PackWriter {
    pub tmp: PathBuf,
    file: File,
    buf: Vec<u8>,
    off: u64,
    entries: Vec<IndexEntry>,
    /// Bytes written to the file; writeback started up to `wb_started`,
    /// waited for up to `wb_done`.
    written: u64,
    wb_started: u64,
    wb_done: u64,
}

impl PackWriter {
    pub fn create(tmp: PathBuf) -> Result<PackWriter, StoreError> {
        let _ = std::fs::remove_file(&tmp); // a leftover of a crashed write
        let file = fsio::create_new(&tmp)?;
        let mut buf = Vec::with_capacity(WRITE_BATCH + 2 * PAGE);
        buf.extend_from_slice(HEADER_MAGIC);
        buf.extend_from_slice(&VERSION.to_le_bytes());
        buf.extend_from_slice(&0u32.to_le_bytes());
        Ok(PackWriter {
            tmp,
            file,
            buf,
            off: HEADER_LEN,
            entries: Vec::new(),
            written: 0,
            wb_started: 0,
            wb_done: 0,
        })
    }

    /// Appends one chunk; returns its index entry.
    pub fn add(&mut self, hash: Hash, bytes: &[u8], flags: u32) -> Result<IndexEntry, StoreError> {
        let e = IndexEntry {
            hash,
            offset: self.off,
            len: bytes.len() as u32,
            flags,
        };
        self.buf.extend_from_slice(bytes);
        self.off += bytes.len() as u64;
        self.entries.push(e);
        if self.buf.len() >= WRITE_BATCH {
            self.flush()?;
        }
        Ok(e)
    }

    pub fn chunks(&self) -> usize {
        self.entries.len()
    }

    /// Bytes of chunks written so far (header excluded).
    pub fn chunk_bytes(&self) -> u64 {
        self.off - HEADER_LEN
    }

    fn flush(&mut self) -> Result<(), StoreError> {
        if !self.buf.is_empty() {
            fsio::write_all(&mut self.file, &self.tmp, &self.buf)?;
            self.written += self.buf.len() as u64;
            self.buf.clear();
            if self.written - self.wb_started >= WRITEBACK_STEP {
                self.write_behind();
            }
        }
        Ok(())
    }

    /// Waits for the previous step's writeback and starts this one's.
    /// Best effort: a writeback that fails is reported by the fsync every
    /// pack gets before it is published, and a file system without
    /// `sync_file_range` only loses the smoothing.
    fn write_behind(&mut self) {
        use std::os::fd::AsRawFd;
        let fd = self.file.as_raw_fd();
        // (a length of 0 would mean "to the end of the file")
        let range = |from: u64, to: u64, flags| {
            if to > from {
                // SAFETY: a plain system call on an open fd
                let _ = unsafe {
                    libc::sync_file_range(
                        fd,
                        from as libc::off64_t,
                        (to - from) as libc::off64_t,
                        flags,
                    )
                };
            }
        };
        range(
            self.wb_done,
            self.wb_started,
            libc::SYNC_FILE_RANGE_WAIT_BEFORE
                | libc::SYNC_FILE_RANGE_WRITE
                | libc::SYNC_FILE_RANGE_WAIT_AFTER,
        );
        range(self.wb_started, self.written, libc::SYNC_FILE_RANGE_WRITE);
        self.wb_done = self.wb_started;
        self.wb_started = self.written;
    }

    /// Writes index and trailer; returns the file, for the caller to
    /// fsync (in parallel with the snapshot's other files).
    pub fn finish(mut self) -> Result<File, StoreError> {
        self.flush()?;
        let mut entries = std::mem::take(&mut self.entries);
        entries.sort_unstable_by_key(|e| e.hash);
        let mut index = Vec::with_capacity(entries.len() * ENTRY_LEN + TRAILER_LEN as usize);
        for e in &entries {
            e.encode(&mut index);
        }
        let sum = blake3::hash(&index);
        let index_off = self.off;
        index.extend_from_slice(TRAILER_MAGIC);
        index.extend_from_slice(&index_off.to_le_bytes());
        index.extend_from_slice(&(entries.len() as u64).to_le_bytes());
        index.extend_from_slice(&0u64.to_le_bytes());
        index.extend_from_slice(sum.as_bytes());
        fsio::write_all(&mut self.file, &self.tmp, &index)?;
        Ok(self.file)
    }
}

fn corrupt(path: &Path, detail: impl Into<String>) -> StoreError {
    StoreError::PackCorrupt {
        path: path.to_path_buf(),
        detail: detail.into(),
    }
}

fn pread(file: &File, path: &Path, buf: &mut [u8], off: u64) -> Result<(), StoreError> {
    file.read_exact_at(buf, off).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            corrupt(path, format!("short read at offset {off}"))
        } else {
            io_at("read", path)(e)
        }
    })
}

/// An open pack and its verified index.
pub struct LoadedPack {
    pub file: File,
    pub entries: Vec<IndexEntry>,
    pub size: u64,
}

/// Opens a pack and loads its index: checks header, trailer, the index's
/// checksum and every entry's bounds.  Reads no chunk.
fn open_pack(path: &Path) -> Result<File, StoreError> {
    File::open(path).map_err(|e| match e.raw_os_error() {
        Some(libc::ENOENT) => StoreError::MissingPack {
            path: path.to_path_buf(),
        },
        _ => io_at("open", path)(e),
    })
}

/// The pack opened, its index not read (`entries` empty): the file's
/// checks wait for `load`.
pub fn open_unloaded(path: &Path) -> Result<LoadedPack, StoreError> {
    let file = open_pack(path)?;
    let size = file.metadata().map_err(io_at("stat", path))?.len();
    Ok(LoadedPack {
        file,
        entries: Vec::new(),
        size,
    })
}

pub fn load(path: &Path) -> Result<LoadedPack, StoreError> {
    let file = open_pack(path)?;
    let size = file.metadata().map_err(io_at("stat", path))?.len();
    if size < HEADER_LEN + TRAILER_LEN {
        return Err(corrupt(path, format!("truncated: {size} bytes")));
    }
    let mut head = [0u8; HEADER_LEN as usize];
    pread(&file, path, &mut head, 0)?;
    if &head[..8] != HEADER_MAGIC {
        return Err(corrupt(path, "bad header magic"));
    }
    let version = u32::from_le_bytes(head[8..12].try_into().unwrap_or_default());
    if version > VERSION {
        return Err(StoreError::NewerVersion {
            path: path.to_path_buf(),
            found: version,
            supported: VERSION,
        });
    }
    if version == 0 {
        return Err(corrupt(path, "version 0"));
    }
    let mut tr = [0u8; TRAILER_LEN as usize];
    pread(&file, path, &mut tr, size - TRAILER_LEN)?;
    if &tr[..8] != TRAILER_MAGIC {
        return Err(corrupt(path, "bad trailer magic (truncated or torn)"));
    }
    let index_off = u64::from_le_bytes(tr[8..16].try_into().unwrap_or_default());
    let count = u64::from_le_bytes(tr[16..24].try_into().unwrap_or_default());
    let index_len = count.checked_mul(ENTRY_LEN as u64);
    if index_len
        .and_then(|l| l.checked_add(index_off))
        .and_then(|e| e.checked_add(TRAILER_LEN))
        != Some(size)
        || index_off < HEADER_LEN
    {
        return Err(corrupt(path, "trailer does not match the file's size"));
    }
    let mut index = vec![0u8; (count as usize) * ENTRY_LEN];
    pread(&file, path, &mut index, index_off)?;
    if blake3::hash(&index).as_bytes() != &tr[32..64] {
        return Err(corrupt(path, "index checksum mismatch"));
    }
    let mut entries = Vec::with_capacity(count as usize);
    for b in index.chunks_exact(ENTRY_LEN) {
        let e = IndexEntry::decode(b);
        let end = e.offset.checked_add(e.len as u64);
        if e.offset < HEADER_LEN
            || end.is_none_or(|end| end > index_off)
            || e.len == 0
            || e.len as usize > PAGE
            || e.flags & !FLAG_RAW != 0
            || (e.flags & FLAG_RAW != 0 && e.len as usize != PAGE)
        {
            return Err(corrupt(
                path,
                format!("index entry {} out of bounds", hex(&e.hash)),
            ));
        }
        if let Some(prev) = entries.last().map(|p: &IndexEntry| p.hash)
            && prev >= e.hash
        {
            return Err(corrupt(path, "index not sorted"));
        }
        entries.push(e);
    }
    Ok(LoadedPack {
        file,
        entries,
        size,
    })
}

/// Reusable buffers for reading chunks (one per thread or per verifier).
pub struct ChunkReader {
    cbuf: Vec<u8>,
    dctx: zstd::bulk::Decompressor<'static>,
}

impl ChunkReader {
    pub fn new() -> Result<ChunkReader, StoreError> {
        let dctx = zstd::bulk::Decompressor::new().map_err(|e| StoreError::Io {
            path: PathBuf::new(),
            op: "zstd",
            detail: e.to_string(),
        })?;
        Ok(ChunkReader {
            cbuf: vec![0u8; PAGE * 2],
            dctx,
        })
    }

    /// Reads the chunk `e` of the pack `file` into `out` (one page), and
    /// checks it decompresses to one page whose blake3 is `e.hash`.
    pub fn read(
        &mut self,
        file: &File,
        path: &Path,
        e: &IndexEntry,
        out: &mut [u8],
    ) -> Result<(), StoreError> {
        if out.len() != PAGE {
            return Err(StoreError::InvalidArgument {
                path: path.to_path_buf(),
                detail: format!("page buffer of {} bytes, not {PAGE}", out.len()),
            });
        }
        if e.flags & FLAG_RAW != 0 {
            pread(file, path, out, e.offset)?;
            return check_hash(path, e, out);
        }
        let n = e.len as usize;
        let mut cbuf = std::mem::take(&mut self.cbuf);
        if cbuf.len() < n {
            cbuf.resize(n, 0);
        }
        let r = pread(file, path, &mut cbuf[..n], e.offset)
            .and_then(|_| self.check_bytes(path, e, &cbuf[..n], out));
        self.cbuf = cbuf;
        r
    }

    /// Decompresses chunk bytes (of entry `e`) into `out` and checks them.
    pub fn check_bytes(
        &mut self,
        path: &Path,
        e: &IndexEntry,
        bytes: &[u8],
        out: &mut [u8],
    ) -> Result<(), StoreError> {
        if e.flags & FLAG_RAW != 0 {
            out.copy_from_slice(bytes);
        } else {
            let got = self
                .dctx
                .decompress_to_buffer(bytes, out)
                .map_err(|err| chunk_bad(path, e, format!("zstd: {err}")))?;
            if got != PAGE {
                return Err(chunk_bad(path, e, format!("decompressed to {got} bytes")));
            }
        }
        check_hash(path, e, out)
    }
}

fn chunk_bad(path: &Path, e: &IndexEntry, detail: String) -> StoreError {
    StoreError::ChunkChecksum {
        path: path.to_path_buf(),
        offset: e.offset,
        detail,
    }
}

fn check_hash(path: &Path, e: &IndexEntry, page: &[u8]) -> Result<(), StoreError> {
    if blake3::hash(page).as_bytes() != &e.hash {
        return Err(chunk_bad(
            path,
            e,
            format!("blake3 differs from {}", hex(&e.hash)),
        ));
    }
    Ok(())
}

/// Compresses pages for a writer: zstd at `level`, with its literals left
/// raw first (LZ matches alone, about half the cost: the Huffman table a
/// 4 KiB frame builds for its literals is most of level 1's time), and with
/// them entropy-coded only where LZ did not halve the page.  Where the
/// entropy coder then pays (records over a small alphabet, hex strings), the
/// next `ENTROPY_RUN` pages go straight to it, and a page is tried the fast
/// way again after them.  docs/store.md, "Compression".
pub struct ChunkCompressor {
    /// literals raw
    fast: zstd::bulk::Compressor<'static>,
    /// literals Huffman-coded, as zstd's level does by default
    entropy: zstd::bulk::Compressor<'static>,
    out_fast: Vec<u8>,
    out_entropy: Vec<u8>,
    entropy_left: u32,
    pub stats: CompressStats,
}

/// How a writer's pages were compressed (tests, and the bench).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CompressStats {
    /// pages kept with raw literals
    pub fast: u64,
    /// pages kept entropy-coded
    pub entropy: u64,
    /// pages tried both ways
    pub both: u64,
}

/// After a page the entropy coder made 10% smaller than LZ alone, this many
/// pages are entropy-coded without trying the fast way first.
const ENTROPY_RUN: u32 = 15;

fn zstd_err(e: std::io::Error) -> StoreError {
    StoreError::Io {
        path: PathBuf::new(),
        op: "zstd",
        detail: e.to_string(),
    }
}

impl ChunkCompressor {
    pub fn new(level: i32) -> Result<ChunkCompressor, StoreError> {
        use zstd::zstd_safe::{CParameter, ParamSwitch};
        let mut fast = zstd::bulk::Compressor::new(level).map_err(zstd_err)?;
        fast.set_parameter(CParameter::LiteralCompressionMode(ParamSwitch::Disable))
            .map_err(zstd_err)?;
        let entropy = zstd::bulk::Compressor::new(level).map_err(zstd_err)?;
        Ok(ChunkCompressor {
            fast,
            entropy,
            out_fast: Vec::with_capacity(zstd::zstd_safe::compress_bound(PAGE)),
            out_entropy: Vec::with_capacity(zstd::zstd_safe::compress_bound(PAGE)),
            entropy_left: 0,
            stats: CompressStats::default(),
        })
    }

    /// The chunk bytes and flags for one page: a zstd frame, or the page
    /// itself when zstd does not make it smaller.  Either frame decodes
    /// the same way (the mode is not recorded).
    pub fn compress<'a>(&'a mut self, page: &'a [u8]) -> (&'a [u8], u32) {
        let fast = if self.entropy_left > 0 {
            self.entropy_left -= 1;
            None
        } else {
            self.fast.compress_to_buffer(page, &mut self.out_fast).ok()
        };
        if let Some(f) = fast.filter(|&f| f <= PAGE / 2) {
            self.stats.fast += 1;
            return (&self.out_fast[..f], 0);
        }
        let entropy = self
            .entropy
            .compress_to_buffer(page, &mut self.out_entropy)
            .ok();
        if let (Some(f), Some(e)) = (fast, entropy) {
            self.stats.both += 1;
            if e * 10 < f * 9 {
                self.entropy_left = ENTROPY_RUN;
            }
        }
        match (fast, entropy) {
            (Some(f), Some(e)) if e < f && e < PAGE => {
                self.stats.entropy += 1;
                (&self.out_entropy[..e], 0)
            }
            (None, Some(e)) if e < PAGE => {
                self.stats.entropy += 1;
                (&self.out_entropy[..e], 0)
            }
            (Some(f), _) if f < PAGE => {
                self.stats.fast += 1;
                (&self.out_fast[..f], 0)
            }
            _ => (page, FLAG_RAW),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xorshift(x: &mut u64) -> u64 {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x
    }

    /// Records of a key and a value of repeated bytes (what redis-benchmark
    /// writes): LZ alone compresses them.
    fn repeated_values(seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        let mut p = vec![0u8; PAGE];
        for rec in p.chunks_mut(128) {
            let key = format!("key:{:012}", xorshift(&mut x) % 1_000_000);
            rec[..key.len()].copy_from_slice(key.as_bytes());
            rec[key.len()..].fill(b'x');
        }
        p
    }

    /// Random letters of a 16-letter alphabet: no LZ match, half the
    /// entropy of a byte; only the entropy coder compresses them.
    fn small_alphabet(seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..PAGE)
            .map(|_| b'a' + (xorshift(&mut x) % 16) as u8)
            .collect()
    }

    fn roundtrip(c: &mut ChunkCompressor, page: &[u8]) -> usize {
        let (bytes, flags) = c.compress(page);
        let n = bytes.len();
        let back = if flags & FLAG_RAW != 0 {
            bytes.to_vec()
        } else {
            zstd::bulk::decompress(bytes, PAGE).expect("a chunk decodes")
        };
        assert_eq!(back, page, "a chunk decodes to its page");
        n
    }

    #[test]
    fn each_kind_of_page_takes_the_mode_that_pays() {
        let mut c = ChunkCompressor::new(super::super::format::ZSTD_LEVEL).expect("zstd");
        // LZ halves these: raw literals, no second try
        for i in 0..20 {
            assert!(roundtrip(&mut c, &repeated_values(i)) < PAGE / 4);
        }
        assert_eq!(
            c.stats,
            CompressStats {
                fast: 20,
                entropy: 0,
                both: 0
            }
        );
        // LZ finds nothing here: the entropy coder is tried and kept, and the
        // pages after the first go to it directly, with a fast try every
        // ENTROPY_RUN + 1 pages
        for i in 0..32 {
            assert!(roundtrip(&mut c, &small_alphabet(i + 100)) < PAGE * 6 / 10);
        }
        assert_eq!(c.stats.entropy, 32);
        assert_eq!(c.stats.both, 2);
        // back to pages LZ halves: after the run, the fast way again
        let before = c.stats;
        for i in 0..40 {
            assert!(roundtrip(&mut c, &repeated_values(i + 200)) < PAGE / 4);
        }
        assert!(c.stats.fast - before.fast >= 40 - ENTROPY_RUN as u64);
        // random bytes: stored as they are
        let mut x = 7u64;
        let random: Vec<u8> = (0..PAGE).map(|_| xorshift(&mut x) as u8).collect();
        let (bytes, flags) = c.compress(&random);
        assert_eq!((bytes.len(), flags), (PAGE, FLAG_RAW));
    }

    #[test]
    fn a_pack_larger_than_the_writeback_step_is_written_behind_and_reads_back() {
        let d = tempfile::tempdir().unwrap();
        let tmp = d.path().join("p.pack");
        let mut w = PackWriter::create(tmp.clone()).unwrap();
        let mut x = 11u64;
        let pages: Vec<Vec<u8>> = (0..3 * WRITEBACK_STEP as usize / PAGE + 5)
            .map(|_| (0..PAGE).map(|_| xorshift(&mut x) as u8).collect())
            .collect();
        let entries: Vec<IndexEntry> = pages
            .iter()
            .map(|p| w.add(*blake3::hash(p).as_bytes(), p, FLAG_RAW).unwrap())
            .collect();
        // about three steps: writeback waited for up to the second,
        // started up to the third, and less than a step not started
        assert!(
            w.wb_done >= 2 * WRITEBACK_STEP - (WRITE_BATCH as u64),
            "{}",
            w.wb_done
        );
        assert!(w.wb_started - w.wb_done >= WRITEBACK_STEP);
        assert!(w.written - w.wb_started < WRITEBACK_STEP);
        w.finish().unwrap().sync_all().unwrap();
        let lp = load(&tmp).unwrap();
        assert_eq!(lp.entries.len(), pages.len());
        let mut r = ChunkReader::new().unwrap();
        let mut out = vec![0u8; PAGE];
        for (p, e) in pages.iter().zip(&entries) {
            r.read(&lp.file, &tmp, e, &mut out).unwrap();
            assert_eq!(&out, p);
        }
    }
}
