//! The store's commands: `rekindle snapshots|verify|gc|send|recv DIR`, and
//! the hidden `store-import`/`store-export` (snapshots of plain files, for
//! tests, before an app is involved).  Errors print as
//! `rekindle: <code>: <message>` (exit 1); usage errors exit 2 (clap).

use std::io::{IsTerminal, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use clap::Subcommand;
use serde_json::{Value, json};

use crate::cli::parse_duration;
use crate::store::format::PAGE;
use crate::store::{
    NewSnapshot, Progress, RegionKind, RegionMeta, Retention, SnapshotId, SnapshotInfo, Store,
    StoreError,
};

#[derive(Debug, Subcommand)]
pub enum StoreCommand {
    /// List a snapshot store's snapshots: id, parent, kind, tags, age, sizes.
    #[command(
        long_about = "List the snapshots of the store DIR, oldest first: id, parent, kind (full or \
                      delta), age, pages in its own map, logical size (the bytes a restore \
                      produces), new bytes it added on disk, tags.  Then the totals: bytes on \
                      disk and the dedup ratio (logical bytes of every snapshot / bytes on disk).  \
                      A manifest that does not load is listed as broken with its reason code \
                      (exit status 1); `rekindle verify` checks everything."
    )]
    Snapshots {
        /// The store directory.
        dir: PathBuf,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Check every manifest, page map, pack index and chunk checksum of a store.
    #[command(
        long_about = "Check the store DIR: every pack's index and every chunk in it (decompressed \
                      and hashed), every manifest's checksum, its page map, its chain of parents \
                      and that every chunk it needs is present and sound.  Lists each problem \
                      with its reason code and path, which snapshots remain restorable, and the \
                      leftovers of crashed writes (not errors: `rekindle gc` removes them).  \
                      Exit status 1 if anything is wrong."
    )]
    Verify {
        /// The store directory.
        dir: PathBuf,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
        /// Report progress on stderr even when it is not a terminal.
        #[arg(long)]
        progress: bool,
    },
    /// Delete snapshots retention drops, then unreferenced packs and leftovers.
    #[command(
        long_about = "Apply a retention policy to the store DIR, then collect.  With no --keep* \
                      option no snapshot is deleted.  Otherwise a snapshot is kept if any rule \
                      keeps it; the newest snapshot and every tagged one are always kept.  A kept \
                      snapshot whose parent is deleted is first rewritten as a full snapshot \
                      (atomically), so every kept snapshot restores byte-identical.  Then packs \
                      none of whose chunks a kept snapshot needs, page maps no manifest names \
                      and the leftovers of crashed writes are removed.  Packs partly live are \
                      kept; the bytes they waste are reported."
    )]
    Gc {
        /// The store directory.
        dir: PathBuf,
        /// Keep the N newest snapshots.
        #[arg(long, value_name = "N")]
        keep: Option<usize>,
        /// Keep every snapshot younger than DUR (e.g. 30m, 2h, 7d).
        #[arg(long, value_name = "DUR", value_parser = parse_duration)]
        keep_within: Option<Duration>,
        /// Keep the newest snapshot of each of the N latest hours (UTC) that have one.
        #[arg(long, value_name = "N")]
        keep_hourly: Option<usize>,
        /// Keep the newest snapshot of each of the N latest days (UTC) that have one.
        #[arg(long, value_name = "N")]
        keep_daily: Option<usize>,
        /// Report what would be deleted; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
        /// Report progress on stderr even when it is not a terminal.
        #[arg(long)]
        progress: bool,
    },
    /// Write a snapshot (or with --since, the increments after one) to stdout as a stream.
    #[command(
        long_about = "Write a snapshot of the store DIR to stdout in the rekindle snapshot stream \
                      format (docs/store.md): DIR@ID or DIR@TAG picks one (default: the newest).  \
                      Without --since the snapshot is sent folded into one full snapshot; with \
                      --since ID, every snapshot after ID up to it, with only the chunks a \
                      receiver holding ID lacks.  --follow then sends each new snapshot as it is \
                      published, until stdout closes.  `rekindle recv DIR2` reads the stream."
    )]
    Send {
        /// The store directory, optionally @ID or @TAG.
        #[arg(value_name = "DIR[@ID|@TAG]")]
        source: String,
        /// Send only what a store holding this snapshot lacks.
        #[arg(long, value_name = "ID")]
        since: Option<String>,
        /// Keep running: send each new snapshot as it is published.
        #[arg(long)]
        follow: bool,
        /// Report progress on stderr even when it is not a terminal.
        #[arg(long)]
        progress: bool,
    },
    /// Read a snapshot stream from stdin into a store (created if missing).
    #[command(
        long_about = "Read a stream written by `rekindle send` from stdin into the store DIR \
                      (created if it does not exist), publishing each snapshot atomically when \
                      its last frame has arrived and checked.  Snapshots the store already has \
                      are skipped.  A stream cut short or damaged is refused (exit 1): nothing \
                      of the snapshot in flight is published; the snapshots before it are."
    )]
    Recv {
        /// The store directory.
        dir: PathBuf,
        /// Print the ids received as JSON.
        #[arg(long)]
        json: bool,
        /// Report progress on stderr even when it is not a terminal.
        #[arg(long)]
        progress: bool,
    },
    /// Write the location index of a snapshot (a faster restore).
    #[command(
        long_about = "Write the location index of a snapshot of the store DIR (DIR@ID or DIR@TAG; \
                      default: the newest): the folded page table a restore reads instead of \
                      folding the snapshot's chain of page maps and reading the packs' indexes \
                      (docs/store.md, \"Location indexes\").  The snapshot engine writes one for \
                      its newest snapshot by itself; this is for a snapshot it did not index \
                      (received with `rekindle recv`, tagged, or older).  Prints how long the \
                      snapshot took to open and the index's size."
    )]
    Index {
        /// The store directory, optionally @ID or @TAG.
        #[arg(value_name = "DIR[@ID|@TAG]")]
        source: String,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// (testing) Make a snapshot from files: each file's bytes are a region.
    #[command(hide = true)]
    StoreImport {
        dir: PathBuf,
        #[arg(long)]
        app: String,
        #[arg(long)]
        tag: Vec<String>,
        /// A delta against this snapshot (id, tag or "latest"): only the
        /// pages that differ from it are stored.
        #[arg(long, value_name = "ID", conflicts_with = "full")]
        parent: Option<String>,
        /// A full snapshot (the default without --parent).
        #[arg(long)]
        full: bool,
        #[arg(long, default_value_t = 0)]
        epoch: u64,
        #[arg(long, default_value_t = 0)]
        generation: u64,
        /// KIND:NAME:ADDR=FILE (kind arena, static or range; ADDR hex or decimal).
        #[arg(long, value_name = "KIND:NAME:ADDR=FILE", value_parser = parse_region, required = true)]
        region: Vec<RegionArg>,
    },
    /// (testing) Write regions of a snapshot to files.
    #[command(hide = true)]
    StoreExport {
        #[arg(value_name = "DIR[@ID|@TAG]")]
        source: String,
        /// NAME=FILE
        #[arg(long, value_name = "NAME=FILE", value_parser = parse_export, required = true)]
        region: Vec<(String, PathBuf)>,
    },
}

#[derive(Debug, Clone)]
pub struct RegionArg {
    pub kind: RegionKind,
    pub name: String,
    pub addr: u64,
    pub file: PathBuf,
}

fn parse_region(s: &str) -> Result<RegionArg, String> {
    let (spec, file) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected KIND:NAME:ADDR=FILE"))?;
    let parts: Vec<&str> = spec.split(':').collect();
    let [kind, name, addr] = parts[..] else {
        return Err(format!("{s:?}: expected KIND:NAME:ADDR=FILE"));
    };
    let kind = RegionKind::parse(kind)
        .ok_or_else(|| format!("{s:?}: kind {kind:?} is not arena, static or range"))?;
    if name.is_empty() || file.is_empty() {
        return Err(format!("{s:?}: empty name or file"));
    }
    let addr = match addr.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => addr.parse(),
    }
    .map_err(|e| format!("{s:?}: address {addr:?}: {e}"))?;
    Ok(RegionArg {
        kind,
        name: name.into(),
        addr,
        file: file.into(),
    })
}

fn parse_export(s: &str) -> Result<(String, PathBuf), String> {
    match s.split_once('=') {
        Some((n, f)) if !n.is_empty() && !f.is_empty() => Ok((n.into(), f.into())),
        _ => Err(format!("{s:?}: expected NAME=FILE")),
    }
}

/// `DIR@SPEC` -> (DIR, SPEC); the spec is "" (latest) without '@'.
fn split_source(s: &str) -> (PathBuf, String) {
    match s.rsplit_once('@') {
        Some((d, spec)) if !d.is_empty() => (PathBuf::from(d), spec.to_string()),
        _ => (PathBuf::from(s), String::new()),
    }
}

/// Runs a store command; returns the exit status.
pub fn run(cmd: StoreCommand) -> i32 {
    let json = matches!(
        &cmd,
        StoreCommand::Snapshots { json: true, .. }
            | StoreCommand::Verify { json: true, .. }
            | StoreCommand::Gc { json: true, .. }
            | StoreCommand::Recv { json: true, .. }
            | StoreCommand::Index { json: true, .. }
    );
    match dispatch(cmd) {
        Ok(code) => code,
        Err(e) => {
            if json {
                println!("{}", json!({ "error": e.to_json() }));
            }
            eprintln!("rekindle: {}: {e}", e.code());
            1
        }
    }
}

fn dispatch(cmd: StoreCommand) -> Result<i32, StoreError> {
    match cmd {
        StoreCommand::Snapshots { dir, json } => snapshots(&dir, json),
        StoreCommand::Verify {
            dir,
            json,
            progress,
        } => verify(&dir, json, progress),
        StoreCommand::Gc {
            dir,
            keep,
            keep_within,
            keep_hourly,
            keep_daily,
            dry_run,
            json,
            progress,
        } => {
            let policy = Retention {
                keep_last: keep,
                keep_within,
                keep_hourly,
                keep_daily,
                dry_run,
            };
            if policy.keep_last == Some(0)
                || policy.keep_hourly == Some(0)
                || policy.keep_daily == Some(0)
            {
                return Err(StoreError::InvalidArgument {
                    path: dir,
                    detail: "--keep, --keep-hourly and --keep-daily take N >= 1".into(),
                });
            }
            gc(&dir, &policy, json, progress)
        }
        StoreCommand::Send {
            source,
            since,
            follow,
            progress,
        } => send(&source, since.as_deref(), follow, progress),
        StoreCommand::Recv {
            dir,
            json,
            progress,
        } => recv(&dir, json, progress),
        StoreCommand::Index { source, json } => index(&source, json),
        StoreCommand::StoreImport {
            dir,
            app,
            tag,
            parent,
            full: _,
            epoch,
            generation,
            region,
        } => import(
            &dir,
            app,
            tag,
            parent.as_deref(),
            epoch,
            generation,
            &region,
        ),
        StoreCommand::StoreExport { source, region } => export(&source, &region),
    }
}

/// Progress on stderr: when it is a terminal, or asked for; at most 5 a second.
fn reporter(asked: bool) -> impl FnMut(Progress) {
    let on = asked || std::io::stderr().is_terminal();
    let tty = std::io::stderr().is_terminal();
    let mut last: Option<Instant> = None;
    move |p: Progress| {
        let end = p.total > 0 && p.done >= p.total;
        if !on || (!end && last.is_some_and(|t| t.elapsed() < Duration::from_millis(200))) {
            return;
        }
        last = Some(Instant::now());
        let total = if p.total > 0 {
            format!("/{}", p.total)
        } else {
            String::new()
        };
        let line = format!("{} {}{total}", p.phase.as_str(), p.done);
        if tty {
            eprint!("\r\x1b[K{line}{}", if end { "\n" } else { "" });
        } else {
            eprintln!("progress: {line}");
        }
    }
}

fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn age(t: SystemTime) -> Duration {
    SystemTime::now().duration_since(t).unwrap_or_default()
}

fn short_age(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

/// Bytes of every file in the store (what a backup copies).
fn disk_usage(dir: &Path) -> u64 {
    fn walk(p: &Path) -> u64 {
        let Ok(rd) = std::fs::read_dir(p) else {
            return 0;
        };
        rd.flatten()
            .map(|e| match e.metadata() {
                Ok(m) if m.is_dir() => walk(&e.path()),
                Ok(m) => m.len(),
                Err(_) => 0,
            })
            .sum()
    }
    walk(dir)
}

fn info_json(i: &SnapshotInfo) -> Value {
    json!({
        "id": i.id,
        "parent": i.parent,
        "kind": if i.full { "full" } else { "delta" },
        "tags": i.tags,
        "app": i.app,
        "epoch": i.epoch,
        "generation": i.generation,
        "created": humantime::format_rfc3339_millis(i.created).to_string(),
        "age_seconds": age(i.created).as_secs_f64(),
        "pages": i.pages,
        "logical_bytes": i.logical_bytes,
        "new_bytes_compressed": i.new_bytes_compressed,
        "redo": i.redo.map(|m| json!({"line": format!("{:016x}", m.line), "at": m.at})),
    })
}

fn snapshots(dir: &Path, as_json: bool) -> Result<i32, StoreError> {
    let store = Store::open(dir)?;
    let listed = store.list_all()?;
    let mut infos = Vec::new();
    let mut broken = Vec::new();
    for l in listed {
        match l.manifest {
            Ok(m) => infos.push(m.info()),
            Err(e) => broken.push((l.id, e)),
        }
    }
    let disk = disk_usage(dir);
    let logical: u64 = infos.iter().map(|i| i.logical_bytes).sum();
    let ratio = if disk > 0 {
        logical as f64 / disk as f64
    } else {
        0.0
    };
    if as_json {
        let v = json!({
            "snapshots": infos.iter().map(info_json).collect::<Vec<_>>(),
            "broken": broken.iter().map(|(id, e)| json!({"id": id, "error": e.to_json()})).collect::<Vec<_>>(),
            "totals": {"snapshots": infos.len(), "disk_bytes": disk, "logical_bytes": logical, "dedup_ratio": ratio},
        });
        println!("{v}");
    } else {
        println!(
            "{:<30} {:<30} {:<5} {:>5} {:>8} {:>10} {:>10}  TAGS",
            "ID", "PARENT", "KIND", "AGE", "PAGES", "LOGICAL", "NEW"
        );
        for i in &infos {
            println!(
                "{:<30} {:<30} {:<5} {:>5} {:>8} {:>10} {:>10}  {}",
                i.id,
                i.parent.as_ref().map_or("-".into(), |p| p.to_string()),
                if i.full { "full" } else { "delta" },
                short_age(age(i.created)),
                i.pages,
                human(i.logical_bytes),
                human(i.new_bytes_compressed),
                i.tags.join(",")
            );
        }
        for (id, e) in &broken {
            println!("{id:<30} BROKEN {}: {e}", e.code());
        }
        println!(
            "{} snapshots{}; {} on disk; {} logical; dedup ratio {ratio:.1}x",
            infos.len(),
            if broken.is_empty() {
                String::new()
            } else {
                format!(" ({} broken)", broken.len())
            },
            human(disk),
            human(logical)
        );
    }
    Ok(if broken.is_empty() { 0 } else { 1 })
}

fn index(source: &str, as_json: bool) -> Result<i32, StoreError> {
    let (dir, spec) = split_source(source);
    let t0 = Instant::now();
    let store = Store::open_unindexed(&dir)?;
    let id = store.resolve(&spec)?;
    let (reader, how) = store.open_snapshot_traced(&id)?;
    let open_ms = t0.elapsed().as_secs_f64() * 1e3;
    let (path, bytes) = store.write_location_index(&reader)?;
    let took_ms = t0.elapsed().as_secs_f64() * 1e3;
    if as_json {
        let v = json!({
            "id": id, "path": path.display().to_string(), "bytes": bytes,
            "open_ms": (open_ms * 10.0).round() / 10.0, "took_ms": (took_ms * 10.0).round() / 10.0,
            "opened_with": how.code(), "deltas": how.deltas,
        });
        println!("{v}");
    } else {
        println!(
            "{}: {bytes} bytes; the snapshot opened in {open_ms:.1} ms ({}), written in {took_ms:.1} ms",
            path.display(),
            how.code()
        );
    }
    Ok(0)
}

/// What a start from the newest snapshot would replay of the redo log:
/// Ok(None) when it has no place in one; Err when the records after it do
/// not read back (a restore would refuse to start).
fn verify_redo(
    store: &Store,
    dir: &Path,
) -> Result<Option<crate::store::redo::RedoStream>, StoreError> {
    let Some(newest) = store.list()?.pop() else {
        return Ok(None);
    };
    match newest.redo {
        Some(m) if m.line != 0 => crate::store::redo::read_stream(dir, m.line, m.at).map(Some),
        _ => Ok(None),
    }
}

fn verify(dir: &Path, as_json: bool, progress: bool) -> Result<i32, StoreError> {
    let store = Store::open(dir)?;
    let mut rep = store.verify(&mut reporter(progress))?;
    let redo = match verify_redo(&store, dir) {
        Ok(r) => r,
        Err(e) => {
            rep.errors.push(e);
            None
        }
    };
    let restorable = rep.snapshots.iter().filter(|s| s.restorable).count();
    if as_json {
        let v = json!({
            "ok": rep.ok(),
            "redo": redo.as_ref().map(|s| json!({
                "line": format!("{:016x}", s.line), "from": s.from, "end": s.end, "records": s.records,
            })),
            "errors": rep.errors.iter().map(|e| e.to_json()).collect::<Vec<_>>(),
            "snapshots": rep.snapshots.iter().map(|s| json!({
                "id": s.id, "restorable": s.restorable, "error": s.error.as_ref().map(|e| e.to_json())
            })).collect::<Vec<_>>(),
            "leftovers": rep.leftovers.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
            "packs": rep.packs, "chunks": rep.chunks, "pack_bytes": rep.pack_bytes,
            "journal": {"records": rep.journal_records, "torn_tail": rep.journal_torn},
            "published_meanwhile": rep.published_meanwhile,
        });
        println!("{v}");
    } else {
        println!(
            "{} packs, {} chunks, {}",
            rep.packs,
            rep.chunks,
            human(rep.pack_bytes)
        );
        for s in &rep.snapshots {
            match &s.error {
                None => println!("{}  restorable", s.id),
                Some(e) => println!("{}  NOT restorable: {}: {e}", s.id, e.code()),
            }
        }
        for e in &rep.errors {
            println!("error {}: {e}", e.code());
        }
        for p in &rep.leftovers {
            println!("leftover (gc removes it): {}", p.display());
        }
        if rep.journal_records > 0 {
            println!(
                "journal: {} snapshots not folded yet (a restore or the next writer folds them)",
                rep.journal_records
            );
        }
        if let Some(t) = rep.journal_torn {
            println!("journal: a torn last record is ignored ({t}; it was never acknowledged)");
        }
        if let Some(s) = &redo {
            println!(
                "redo: {} records after the newest snapshot read back (line {:016x}, {}..{})",
                s.records, s.line, s.from, s.end
            );
        }
        println!(
            "{}: {restorable} of {} snapshots restorable, {} errors",
            if rep.ok() { "ok" } else { "FAILED" },
            rep.snapshots.len(),
            rep.errors.len()
        );
    }
    Ok(if rep.ok() { 0 } else { 1 })
}

fn gc(dir: &Path, policy: &Retention, as_json: bool, progress: bool) -> Result<i32, StoreError> {
    let mut store = Store::open(dir)?;
    let rep = store.gc(policy, &mut reporter(progress))?;
    if as_json {
        let v = json!({
            "dry_run": rep.dry_run,
            "kept": rep.kept, "deleted": rep.deleted, "rewritten": rep.rewritten,
            "removed": rep.removed.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
            "freed_bytes": rep.freed_bytes,
            "partly_live": rep.partly_live.iter().map(|(p, b)| json!({"pack": p, "dead_bytes": b})).collect::<Vec<_>>(),
            "wasted_bytes": rep.wasted_bytes,
            "broken": rep.broken.iter().map(|e| e.to_json()).collect::<Vec<_>>(),
        });
        println!("{v}");
    } else {
        let would = if rep.dry_run { "would be " } else { "" };
        for id in &rep.rewritten {
            println!("{would}rewritten as full (its parent goes): {id}");
        }
        for id in &rep.deleted {
            println!("{would}deleted: {id}");
        }
        for p in &rep.removed {
            println!("{would}removed: {}", p.display());
        }
        for (p, b) in &rep.partly_live {
            println!("partly live pack kept: {p} ({} dead)", human(*b));
        }
        for e in &rep.broken {
            println!("left alone: {}: {e}", e.code());
        }
        println!(
            "{} kept, {} deleted, {} {}freed, {} wasted in partly live packs",
            rep.kept.len(),
            rep.deleted.len(),
            human(rep.freed_bytes),
            would,
            human(rep.wasted_bytes)
        );
    }
    Ok(0)
}

fn send(
    source: &str,
    since: Option<&str>,
    follow: bool,
    progress: bool,
) -> Result<i32, StoreError> {
    let (dir, spec) = split_source(source);
    let mut store = Store::open(&dir)?;
    if std::io::stdout().is_terminal() {
        return Err(StoreError::InvalidArgument {
            path: "<stdout>".into(),
            detail: "stdout is a terminal: redirect it (| rekindle recv DIR2, > FILE)".into(),
        });
    }
    let id = store.resolve(&spec)?;
    let since = match since {
        Some(s) => Some(store.resolve(s)?),
        None => None,
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::with_capacity(1 << 20, stdout.lock());
    match store.send(
        &id,
        since.as_ref(),
        follow,
        &mut out,
        &mut reporter(progress),
    ) {
        Ok(()) => Ok(0),
        // the reader went away: the end of a --follow
        Err(StoreError::OutputClosed { .. }) if follow => Ok(0),
        Err(e) => Err(e),
    }
}

fn recv(dir: &Path, as_json: bool, progress: bool) -> Result<i32, StoreError> {
    let mut store = Store::create_or_open(dir)?;
    let stdin = std::io::stdin();
    let mut input = std::io::BufReader::with_capacity(1 << 20, stdin.lock());
    let ids = store.recv(&mut input, &mut reporter(progress))?;
    if as_json {
        println!("{}", json!({ "received": ids }));
    } else {
        for id in &ids {
            println!("received {id}");
        }
    }
    Ok(0)
}

fn read_file(p: &Path) -> Result<Vec<u8>, StoreError> {
    std::fs::read(p).map_err(crate::store::error::io_at("read", p))
}

fn import(
    dir: &Path,
    app: String,
    tags: Vec<String>,
    parent: Option<&str>,
    epoch: u64,
    generation: u64,
    regions: &[RegionArg],
) -> Result<i32, StoreError> {
    let mut store = Store::create_or_open(dir)?;
    let parent = match parent {
        Some(p) => Some(store.resolve(p)?),
        None => None,
    };
    let datas: Vec<Vec<u8>> = regions
        .iter()
        .map(|r| read_file(&r.file))
        .collect::<Result<_, _>>()?;
    let metas: Vec<RegionMeta> = regions
        .iter()
        .zip(&datas)
        .map(|(r, d)| RegionMeta {
            kind: r.kind,
            name: r.name.clone(),
            addr: r.addr,
            size: d.len() as u64,
            layout: json!({"source": r.file.display().to_string()}),
        })
        .collect();
    let base = match &parent {
        Some(p) => Some(store.open_snapshot(p)?),
        None => None,
    };
    let meta = NewSnapshot {
        parent: parent.clone(),
        full: parent.is_none(),
        epoch,
        generation,
        app,
        tags,
        regions: metas.clone(),
        redo: None,
    };
    let mut w = store.begin(meta)?;
    for (i, (m, data)) in metas.iter().zip(&datas).enumerate() {
        let same = base.as_ref().and_then(|b| {
            b.regions()
                .iter()
                .position(|r| r.same_shape(m))
                .map(|j| (b, j as u32))
        });
        let Some((b, j)) = same else {
            w.put_bytes(i as u32, data)?;
            continue;
        };
        let mut page = vec![0u8; PAGE];
        for (p, chunk) in data.chunks(PAGE).enumerate() {
            page.fill(0);
            page[..chunk.len()].copy_from_slice(chunk);
            let now = if page.iter().all(|&x| x == 0) {
                None
            } else {
                Some(*blake3::hash(&page).as_bytes())
            };
            if b.page_hash(j, p as u64)? != now {
                w.put_page(i as u32, p as u64, &page)?;
            }
        }
    }
    let stats = w.stats();
    let info = w.commit()?;
    let mut v = info_json(&info);
    v["stats"] = json!({
        "pages_put": stats.pages_put, "new_chunks": stats.new_chunks, "dedup_hits": stats.dedup_hits,
        "zero_pages": stats.zero_pages, "bytes_raw": stats.bytes_raw, "bytes_compressed": stats.bytes_compressed,
    });
    println!("{v}");
    Ok(0)
}

fn export(source: &str, regions: &[(String, PathBuf)]) -> Result<i32, StoreError> {
    let (dir, spec) = split_source(source);
    let store = Store::open(&dir)?;
    let id: SnapshotId = store.resolve(&spec)?;
    let r = store.open_snapshot(&id)?;
    for (name, file) in regions {
        let idx = r.region_index(name).ok_or_else(|| StoreError::NotFound {
            path: store.dir().join("snapshots").join(format!("{id}.json")),
            what: format!("region {name:?}"),
        })?;
        let size = r.regions()[idx as usize].size;
        let io = crate::store::error::io_at;
        let f = std::fs::File::create(file).map_err(io("create", file))?;
        f.set_len(size).map_err(io("truncate", file))?;
        r.read_region_into(idx, f.as_fd(), &mut |_| {})?;
        f.sync_all().map_err(io("fsync", file))?;
    }
    println!("{}", json!({"id": id, "regions": regions.len()}));
    std::io::stdout().flush().ok();
    Ok(0)
}
