//! The supervisor's side of durable snapshots: it starts the engine
//! (snapshot/engine.rs), hands it each incarnation's snapshot socket and
//! the memfds it holds, forwards `rekindle checkpoint`, and reports what
//! the engine tells (events, metrics, replies to waiting clients).

use std::os::fd::OwnedFd;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::{Value, json};

use super::{Held, Pending, Plan, Supervisor, send_signal};
use crate::cli::SnapshotConfig;
use crate::clock::now_ns;
use crate::control_socket::error_reply;
use crate::decide::Mode;
use crate::event::ev;
use crate::failure::FailureKind;
use crate::lifecycle::RestartPath;
use crate::proto::StartKind;
use crate::reason::Reason;
use crate::snapshot::baseline::Baseline;
use crate::snapshot::engine::{Cmd, EngineConfig, Handle, Note};
use crate::snapshot::restore::{self, Source};

/// What a start from a snapshot replays of the redo log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ReplayFrom {
    /// Nothing: a rollback, a restore of an older snapshot (going back).
    Nothing,
    /// If the snapshot is the store's newest, every record after it: a
    /// start from the store (`rekindle run`, `rekindle restore --from
    /// DIR[@ID]`: an older one asked for by name is going back).
    IfNewest,
    /// Every record of its line after it: the state when the app died (a
    /// crash inside an unsafe region; the snapshot was picked as the
    /// newest, and one the dead app's last cut commits meanwhile is a later
    /// point of the same line).
    Line,
    /// The records after it up to where the looping incarnation began: a
    /// crash loop goes back to before the loop, not to before the snapshot.
    BeforeTheLoop,
}

/// A rollback under way: the snapshot's memfds, waiting for the running
/// incarnation to be gone.
pub(super) struct Rollback {
    /// "DIR@ID", for events and decisions.
    pub(super) what: String,
    pub(super) id: String,
    /// Bytes of page data read back.
    pub(super) bytes: u64,
    /// How long opening the snapshot and making the memfds took.
    pub(super) read_ms: f64,
    pub(super) fds: Vec<Held>,
    /// The memfds came made (an elected standby's hot image), not read
    /// from the store.
    pub(super) premade: bool,
    /// The store's journal folded before the restore (restore.rs).
    pub(super) journal: Option<serde_json::Value>,
    /// What the memfds hold, for the first snapshot after the start.
    pub(super) baseline: Option<Baseline>,
    /// How the snapshot's chunks were found (a location index or not).
    pub(super) index: Option<crate::store::reader::IndexOutcome>,
    /// Where the snapshot stands in the app's redo log.
    pub(super) redo: Option<crate::store::manifest::RedoMark>,
    pub(super) dir: std::path::PathBuf,
}

impl Rollback {
    pub(super) fn new(dir: &std::path::Path, r: restore::Restored) -> Rollback {
        Rollback {
            what: restore::describe(dir, &r.info),
            id: r.info.id.as_str().to_string(),
            redo: r.info.redo,
            dir: dir.to_path_buf(),
            bytes: r.bytes,
            read_ms: r.took.as_secs_f64() * 1e3,
            fds: r
                .fds
                .into_iter()
                .map(|(kind, name, fd)| Held { kind, name, fd })
                .collect(),
            premade: false,
            baseline: r.baseline,
            index: r.index,
            journal: r.journal,
        }
    }
}

/// Continuous snapshots are told as an event at most this often (the
/// metrics count every one).
const EVENT_EVERY: Duration = Duration::from_secs(1);

pub(super) fn start_engine(
    sc: &SnapshotConfig,
    app: &str,
    replication: Option<std::sync::Arc<crate::cluster::link::ReplicationLink>>,
    store: Option<crate::store::preopened::Preopened>,
    open_at_start: bool,
    redo: Option<std::sync::Arc<crate::redo::Redo>>,
) -> Result<Handle> {
    if sc.publish_every.is_some() && replication.is_some() {
        // not silent: the standbys receive published snapshots only
        eprintln!(
            "rekindle: publish_every_ignored_cluster: --snapshot-publish-every does not apply \
             with --cluster; every snapshot is published for the standbys"
        );
    }
    Handle::start(
        EngineConfig {
            dir: sc.dir.clone(),
            interval: sc.interval,
            app: app.to_string(),
            keep: sc.keep,
            staging_bytes: sc.memory,
            freeze_timeout: Duration::from_millis(50),
            precopy_rounds: 1,
            publish_every: sc.publish_every,
            replication,
            open_at_start,
            redo,
            redo_snapshot_bytes: sc.redo_snapshot_bytes,
        },
        store,
    )
    .context("cannot start the snapshot thread")
}

impl Supervisor {
    /// `rekindle rollback`: reads the snapshot into new memfds (its pages
    /// are checked; a bad one is refused and nothing changes), then kills
    /// the running incarnation; the next one starts warm from them.
    pub(super) fn rollback(&mut self, spec: &str) -> Value {
        let Some(sc) = &self.cfg.snapshots else {
            return json!({"ok": false, "code": "snapshots_off",
                "error": "this supervisor takes no snapshots: run it with --snapshot-dir DIR"});
        };
        let Some(pid) = self.app.as_ref().map(|a| a.pid) else {
            return json!({"ok": false, "code": "no_app", "error": "no incarnation is running"});
        };
        if self.stopping.is_some() || self.rollback.is_some() {
            return json!({"ok": false, "code": "busy", "error": "a stop or a rollback is under way"});
        }
        let src = Source {
            dir: sc.dir.clone(),
            spec: spec.to_string(),
        };
        let r = match restore::materialize(&src) {
            Ok(r) => r,
            Err(e) => {
                self.report.event(
                    ev("error")
                        .s("what", "rollback refused")
                        .s("code", e.code())
                        .s("error", e.to_string()),
                );
                return json!({"ok": false, "code": e.code(), "error": e.to_string()});
            }
        };
        let rb = Rollback::new(&src.dir, r);
        let id = rb.id.clone();
        self.report.event(
            ev("rollback")
                .s("snapshot", rb.what.as_str())
                .s("id", id.as_str())
                .u("bytes", rb.bytes)
                .i("killing", pid as i64),
        );
        self.rollback = Some(rb);
        send_signal(pid, libc::SIGKILL);
        send_signal(-pid, libc::SIGKILL);
        json!({"ok": true, "id": id, "pid": pid})
    }

    /// A restart would go cold: with a store, the newest snapshot taken
    /// before `began` (for a crash loop, when the looping incarnation
    /// started) read into new memfds instead, or None (no store, no such
    /// snapshot, or it does not read back: said in an `event` event) and
    /// the restart goes cold as before.
    pub(super) fn snapshot_before(
        &mut self,
        began: std::time::SystemTime,
        event: &'static str,
    ) -> Option<Rollback> {
        let sc = self.cfg.snapshots.as_ref()?;
        // the journal's records (acknowledged writes) first: the newest
        // snapshot may be one of them
        let folded = crate::store::fold::fold_journal_at(&sc.dir);
        let pick = folded
            .and_then(|_| crate::store::Store::open_unindexed(&sc.dir))
            .and_then(|st| {
                Ok(st
                    .list()?
                    .into_iter()
                    .rev()
                    .find(|i| i.created < began)
                    .map(|i| i.id.as_str().to_string()))
            });
        let fail = |e: &dyn std::fmt::Display, code: &str| {
            ev(event)
                .s("result", "failed")
                .s("code", code)
                .s("error", e.to_string())
        };
        let id = match pick {
            Ok(Some(id)) => id,
            Ok(None) => {
                self.report.event(
                    ev(event)
                        .s("result", "none")
                        .s("why", "no snapshot taken before it began"),
                );
                return None;
            }
            Err(e) => {
                self.report.event(fail(&e, e.code()));
                return None;
            }
        };
        let src = Source {
            dir: sc.dir.clone(),
            spec: id,
        };
        match restore::materialize(&src) {
            Ok(r) => Some(Rollback::new(&src.dir, r)),
            Err(e) => {
                self.report.event(fail(&e, e.code()));
                None
            }
        }
    }

    /// Before a start from the snapshot of `rb`: every record the ring
    /// holds goes to disk and the log closes (the next incarnation's first
    /// cut opens a new line); with `replay`, and if the snapshot is the
    /// store's newest, the records of its line after it are read for the
    /// app to apply (`rk_redo_replay`).  Ok with what to add to the
    /// decision; Err if the log is damaged (the records would be lost).
    pub(super) fn redo_before_start(
        &mut self,
        rb: &Rollback,
        replay: ReplayFrom,
    ) -> Result<String, crate::store::StoreError> {
        self.redo_replay = None;
        // where the dead incarnation began, before the ring is reset
        let began = self.redo.as_ref().map(|r| r.incarnation_start());
        if let Some(r) = self.redo.clone() {
            r.set_replay_pending(false);
            if let Err(e) = r.drain_and_close() {
                // what the dead app committed and did not reach the disk is
                // replayed only as far as it did: said, never silent
                self.report.event(
                    ev("error")
                        .s("what", "redo: the ring's last records could not be written")
                        .s("code", e.code())
                        .s("error", e.to_string()),
                );
            }
        }
        let Some(mark) = rb.redo.filter(|_| replay != ReplayFrom::Nothing) else {
            return Ok(String::new());
        };
        let until = match replay {
            ReplayFrom::Nothing => return Ok(String::new()),
            ReplayFrom::IfNewest => {
                let newest = crate::store::Store::open_unindexed(&rb.dir)?
                    .latest()?
                    .map(|i| i.id.as_str() == rb.id);
                if newest != Some(true) {
                    return Ok(String::new());
                }
                None
            }
            ReplayFrom::Line => None,
            // the loop's incarnation continued this line: what it wrote
            // goes; if it began on another line (or closed), this line
            // ended before it, and all of it comes back
            ReplayFrom::BeforeTheLoop => match began {
                Some((line, at)) if line == mark.line => Some(at),
                Some(_) => None,
                None => return Ok(String::new()),
            },
        };
        let t0 = std::time::Instant::now();
        let Some(rp) = crate::redo::replay_for(&rb.dir, mark, until)? else {
            return Ok(String::new());
        };
        let note = format!("; replays {} redo records after it", rp.records);
        self.report.event(
            ev("redo_replay")
                .s("snapshot", &rb.id)
                .u("records", rp.records)
                .u("bytes", rp.bytes)
                .s("line", format!("{:016x}", rp.line))
                .u("from", rp.from)
                .u("end", rp.end)
                .v("read_ms", (t0.elapsed().as_secs_f64() * 1e4).round() / 10.0),
        );
        self.redo_replay = Some(rp);
        Ok(note)
    }

    /// The plan that starts the next incarnation from a snapshot's memfds;
    /// `replay`: the redo records after it too (a start that must bring
    /// back every acknowledged write, not a rollback or a crash loop's).
    pub(super) fn plan_restored(
        &mut self,
        mut rb: Rollback,
        now: u64,
        mut decision: String,
        signal: i32,
        replay: ReplayFrom,
    ) -> Plan {
        match self.redo_before_start(&rb, replay) {
            Ok(note) => decision.push_str(&note),
            Err(e) => {
                self.report.event(
                    ev("error")
                        .s("what", "redo: cannot read the records after the snapshot; starting from the snapshot alone")
                        .s("code", e.code())
                        .s("error", e.to_string()),
                );
                decision.push_str(&format!(
                    "; its redo records are not replayed ({})",
                    e.code()
                ));
            }
        }
        self.held = std::mem::take(&mut rb.fds);
        self.sort_held();
        self.snapshot_held();
        self.snapshot_baseline(rb.baseline.take());
        self.restored_plan(rb.id, decision, signal, now, 0)
    }

    /// A warm start from a snapshot whose memfds are held now: `id` goes to
    /// the app as INHERIT's reason (rk_restart_info.snapshot).
    pub(super) fn restored_plan(
        &self,
        id: String,
        decision: String,
        signal: i32,
        now: u64,
        dropped: u32,
    ) -> Plan {
        Plan {
            mode: StartKind::Warm,
            generation: self.generation.wrapping_add(1),
            signal,
            t_detect_ns: now,
            reason: id,
            decision,
            decision_code: Reason::Restored,
            backoff_ms: 0,
            dropped,
            restored: true,
        }
    }

    /// The incarnation killed for a rollback is gone: the next one gets the
    /// snapshot's memfds.
    pub(super) fn respawn_rolled_back(&mut self, now: u64) {
        let Some(rb) = self.rollback.take() else {
            return;
        };
        self.app = None;
        let decision = format!("restored from snapshot {} (rekindle rollback)", rb.what);
        let plan = self.plan_restored(rb, now, decision, libc::SIGKILL, ReplayFrom::Nothing);
        self.pending = Some(Pending {
            path: RestartPath::Respawn,
            failure: FailureKind::Request,
            t_failure_ns: None,
            t_detect_ns: now,
            decided: Mode::Warm,
        });
        self.next_spawn = Some((now, plan));
    }

    pub(super) fn snapshot_spawned(&mut self, pid: libc::pid_t, sock: OwnedFd) {
        if let Some(h) = &self.snapshots {
            h.send(Cmd::Incarnation { pid, sock });
        }
    }

    pub(super) fn snapshot_gone(&mut self) {
        if let Some(h) = &self.snapshots {
            h.send(Cmd::Gone);
        }
    }

    /// The next incarnation starts from a snapshot's memfds: the engine's
    /// first snapshot of it is a delta of that snapshot where it can be
    /// (snapshot/baseline.rs).  Sent before the spawn, so the engine has it
    /// before the incarnation's agent says HELLO.
    pub(super) fn snapshot_baseline(&mut self, b: Option<Baseline>) {
        if let (Some(h), Some(b)) = (&self.snapshots, b) {
            h.send(Cmd::Baseline(Box::new(b)));
        }
    }

    /// The engine reads the memfds through its own dups of the held fds.
    pub(super) fn snapshot_held(&mut self) {
        let Some(h) = &self.snapshots else { return };
        let mut v = Vec::new();
        for held in &self.held {
            match held.fd.try_clone() {
                Ok(fd) => v.push((held.kind, held.name.clone(), fd)),
                Err(e) => {
                    self.report.event(
                        ev("error")
                            .s(
                                "what",
                                format!("snapshots: cannot dup the fd of {}: {e}", held.name),
                            )
                            .s("code", "no_fd"),
                    );
                    return;
                }
            }
        }
        h.send(Cmd::Held(v));
    }

    /// `rekindle checkpoint`: Some(reply) now, or None when the reply
    /// follows (with wait, once the snapshot is durable).
    pub(super) fn checkpoint(
        &mut self,
        client: u64,
        tags: Vec<String>,
        wait: bool,
    ) -> Option<Value> {
        let Some(h) = &self.snapshots else {
            return Some(json!({"ok": false, "code": "snapshots_off",
                "error": "this supervisor takes no snapshots: run it with --snapshot-dir DIR"}));
        };
        if self.lazy.is_some() {
            return Some(json!({"ok": false, "code": "lazy_restore",
                "error": "a lazy restore is still reading the arenas back: no snapshot until it is over (event lazy_restore)"}));
        }
        if let Some(bad) = tags
            .iter()
            .find(|t| crate::store::writer::check_tag(t).is_err())
        {
            return Some(error_reply(&format!(
                "bad tag {bad:?}: {}",
                crate::store::writer::check_tag(bad)
                    .err()
                    .unwrap_or_default()
            )));
        }
        if !wait {
            h.send(Cmd::Checkpoint { client: 0, tags });
            return Some(json!({"ok": true, "queued": true}));
        }
        if let Some(c) = self.control.client_mut(client) {
            c.hold_open = true; // until the engine's answer
        }
        h.send(Cmd::Checkpoint { client, tags });
        None
    }

    pub(super) fn on_snapshot_notes(&mut self) {
        let notes = match &self.snapshots {
            Some(h) => h.notes(),
            None => return,
        };
        for n in notes {
            self.on_snapshot_note(n);
        }
    }

    fn on_snapshot_note(&mut self, n: Note) {
        let m = self.report.metrics();
        match n {
            Note::AgentReady { pid, generation } => self.report.event(
                ev("snapshot_agent")
                    .s("state", "ready")
                    .i("pid", pid as i64)
                    .u("generation", generation as u64),
            ),
            Note::AgentUnavailable { pid, status, err } => self.report.event(
                ev("error")
                    .s(
                        "what",
                        "snapshots: the app has no dirty tracking; no snapshot will be taken",
                    )
                    .s("code", status.name())
                    .i("pid", pid as i64)
                    .i("errno", err as i64),
            ),
            Note::Unchanged => m.snapshots.with_label_values(&["unchanged"]).inc(),
            Note::Snapshot(d) => {
                m.snapshots.with_label_values(&["ok"]).inc();
                m.snapshot_stop.observe(d.stop_ns as f64 / 1e9);
                m.snapshot_pages
                    .with_label_values(&["new"])
                    .inc_by(d.new_chunks);
                m.snapshot_pages
                    .with_label_values(&["dedup"])
                    .inc_by(d.dedup_hits);
                m.snapshot_pages
                    .with_label_values(&["zero"])
                    .inc_by(d.zero_pages);
                m.snapshot_pages
                    .with_label_values(&["delta"])
                    .inc_by(d.delta_pages);
                m.snapshot_bytes_written
                    .inc_by(d.bytes_compressed + d.delta_bytes);
                m.snapshot_last_durable
                    .set(crate::store::format::unix_ns(d.info.created) as f64 / 1e9);
                let new = m.snapshot_pages.with_label_values(&["new"]).get();
                let dedup = m.snapshot_pages.with_label_values(&["dedup"]).get();
                if new + dedup > 0 {
                    m.snapshot_dedup_ratio
                        .set(dedup as f64 / (new + dedup) as f64);
                }
                // once per held memfd: its cuts read with pread (slower)
                for (region, why) in &d.views_refused {
                    self.report.event(
                        ev("snapshot_view")
                            .s("region", region)
                            .s("code", why.code())
                            .s("what", "the cut reads this region with pread, not through a view"),
                    );
                }
                self.snapshots_since_event += 1;
                let now = now_ns();
                let every = self
                    .cfg
                    .snapshots
                    .as_ref()
                    .is_some_and(|c| c.events == crate::cli::SnapshotEvents::Every);
                let due = every
                    || now.saturating_sub(self.snapshot_event_ns) >= EVENT_EVERY.as_nanos() as u64;
                if due || d.full || d.unchanged_pages.is_some() || !d.info.tags.is_empty() {
                    self.snapshot_event_ns = now;
                    let count = std::mem::take(&mut self.snapshots_since_event);
                    self.report.event(
                        ev("snapshot")
                            .s("id", d.info.id.as_str())
                            .s("parent", d.info.parent.as_ref().map_or("", |p| p.as_str()))
                            .u("epoch", d.info.epoch)
                            .s("kind", if d.full { "full" } else { "delta" })
                            .v("journaled", d.info.journaled)
                            .s(
                                "base",
                                match d.unchanged_pages {
                                    Some(_) => "restored",
                                    None if d.full => "none",
                                    None => "parent",
                                },
                            )
                            .u("unchanged_pages", d.unchanged_pages.unwrap_or(0))
                            .u("tracked_from_map", d.from_map_regions as u64)
                            .u("unchanged_skipped", d.unchanged_skipped)
                            .v("tags", d.info.tags.clone())
                            .u("stop_us", d.stop_ns / 1000)
                            .s(
                                "redo_line",
                                d.info.redo.map_or(String::new(), |m| format!("{:016x}", m.line)),
                            )
                            .u("redo_at", d.info.redo.map_or(0, |m| m.at))
                            .u("freeze_us", d.freeze_ns / 1000)
                            .u("scan_us", d.scan_ns / 1000)
                            .u("cut_copy_us", d.cut_copy_ns / 1000)
                            .u("rounds", d.rounds as u64)
                            .u("precopy_pages", d.precopy_pages)
                            .u("cut_pages", d.cut_pages)
                            .u("punched_pages", d.punched_pages)
                            .u("new_pages", d.new_chunks)
                            .u("dedup_pages", d.dedup_hits)
                            .u("new_bytes", d.bytes_compressed)
                            .u("delta_pages", d.delta_pages)
                            .u("delta_bytes", d.delta_bytes)
                            .u("staging_peak_bytes", d.staging_peak as u64)
                            .u("took_ms", d.took.as_millis() as u64)
                            .u("took_us", d.took.as_micros() as u64)
                            .u("precopy_us", d.precopy_ns / 1000)
                            .u("cut_us", d.cut_ns / 1000)
                            .u("put_us", d.put_ns / 1000)
                            .u("commit_us", d.commit_ns / 1000)
                            .u("snapshots_since_last_event", count),
                    );
                }
            }
            Note::Failed { code, detail } => {
                m.snapshots.with_label_values(&[code]).inc();
                self.report
                    .event(ev("snapshot_failed").s("code", code).s("error", detail));
            }
            Note::Checkpoint { client, reply } => {
                if client == 0 {
                    return; // a checkpoint nobody waits for
                }
                if let Some(c) = self.control.client_mut(client) {
                    c.hold_open = false;
                    c.queue(&reply);
                    c.flush();
                }
            }
            Note::LagBound {
                held,
                behind_ms,
                max_ms,
            } => self.report.event(
                ev("replication_lag_bound")
                    .s("state", if held { "held" } else { "released" })
                    .s(
                        "code",
                        if held {
                            "standbys_behind_max_lag"
                        } else {
                            "standbys_within_max_lag"
                        },
                    )
                    .u("behind_ms", behind_ms)
                    .u("max_lag_ms", max_ms),
            ),
            Note::BaselineUnused { id, why } => self.report.event(
                ev("snapshot_baseline")
                    .s("state", "not_used")
                    .s("id", id)
                    .s("code", why.code())
                    .s(
                        "why",
                        "the first snapshot of the restored app is full: its snapshot is not this store's newest",
                    ),
            ),
            Note::Gc {
                removed,
                freed_bytes,
                took,
                put_off,
            } => self.report.event(
                ev("snapshot_gc")
                    .u("removed", removed as u64)
                    .u("freed_bytes", freed_bytes)
                    .u("took_ms", took.as_millis() as u64)
                    .u("put_off", u64::from(put_off)),
            ),
            Note::JournalFolded {
                when,
                took,
                records,
                published,
            } => self.report.event(
                ev("journal_folded")
                    .s("when", when.as_str())
                    .u("took_ms", took.as_millis() as u64)
                    .u("records", records)
                    .u("published", published as u64),
            ),
            Note::Indexed { id, result } => self.report.event(match result {
                Ok(d) => ev("location_index")
                    .s("id", d.id.as_str())
                    .s("code", "index_written")
                    .u("bytes", d.bytes)
                    .u("took_ms", d.took.as_millis() as u64)
                    .u("cpu_ms", d.cpu.as_millis() as u64)
                    .s("from", d.from)
                    .u("deltas", d.deltas as u64)
                    .u("removed", d.removed as u64),
                Err(e) => ev("location_index")
                    .s("id", id.as_str())
                    .s("code", e.code())
                    .s("error", e.to_string()),
            }),
        }
    }
}
