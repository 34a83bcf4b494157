//! The in-sync set (docs/failover.md, "The in-sync set"): the standbys
//! whose acknowledgement the primary of a term waits for, recorded in etcd
//! (`insync` = {epoch, standbys}) before it counts.  Only the nodes it
//! names may take the next term.
//!
//! - The primary releases a durable epoch (rk_durable_epoch, link.rs) only
//!   once every standby the set requires has acknowledged the snapshot.  A
//!   standby is required from the moment the primary *starts* writing a set
//!   that names it, until a set without it is confirmed by etcd: so at no
//!   time does etcd name a standby whose acknowledgement was not waited for.
//! - Added: a connected standby that has acknowledged at least what the
//!   set already guarantees (the newest commit, or the slowest member's),
//!   or whose oldest unacknowledged commit is younger than CAUGHT_UP_WITHIN
//!   (commits that never pause, as with async and a short snapshot
//!   interval, would otherwise always be one ahead of it).
//! - Removed: a member gone (no connection) or behind (a commit left
//!   unacknowledged) for `--sync-drop-after`.  It is written out of the set
//!   in etcd first; only then are acknowledgements released without it.
//!   The set never loses its last member (strict): writes then wait.
//! - A new term starts with an empty set (the campaign transaction writes
//!   it): writes wait until a standby has caught up and been added.
//!
//! The board below is shared by the sender (facts: joins, acknowledgements,
//! departures) and the agent (decisions, and the guarded etcd writes).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::lineage::Lineage;
use super::link::ReplicationLink;
use super::records::InSyncRecord;
use crate::store::SnapshotId;

/// A standby whose oldest unacknowledged commit is younger than this keeps
/// up: it may be added.
pub const CAUGHT_UP_WITHIN: Duration = Duration::from_millis(200);

/// One standby as the set decisions see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub node: String,
    /// The newest snapshot it has acknowledged on its current connection
    /// (or holds, as its join said).
    pub acked: Option<SnapshotId>,
    pub connected: bool,
    /// When `connected` last changed.
    pub since: Instant,
    /// When the oldest commit it has not acknowledged was made (None: it
    /// has every commit).
    pub behind_since: Option<Instant>,
}

/// What the agent decides from.
#[derive(Debug, Clone)]
pub struct Facts {
    pub term: u64,
    pub confirmed: Vec<String>,
    pub members: Vec<Member>,
    pub newest: Option<SnapshotId>,
}

/// Why a member leaves the set (event `insync_changed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// Not connected for `--sync-drop-after`.
    Gone,
    /// Left a commit unacknowledged for `--sync-drop-after`.
    Behind,
}

impl DropReason {
    pub fn code(self) -> &'static str {
        match self {
            DropReason::Gone => "standby_gone",
            DropReason::Behind => "standby_behind",
        }
    }
}

/// A change of the set: the new set, who joined it, who left it and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub set: Vec<String>,
    pub added: Vec<String>,
    pub dropped: Vec<(String, DropReason)>,
}

fn why_drop(m: Option<&Member>, now: Instant, after: Duration) -> Option<DropReason> {
    let Some(m) = m else {
        return Some(DropReason::Gone);
    };
    if !m.connected && now.saturating_duration_since(m.since) >= after {
        return Some(DropReason::Gone);
    }
    if m.behind_since
        .is_some_and(|t| now.saturating_duration_since(t) >= after)
    {
        return Some(DropReason::Behind);
    }
    None
}

/// The next set, or None when it stays as it is.
pub fn decide(f: &Facts, now: Instant, drop_after: Duration) -> Option<Change> {
    let by: HashMap<&str, &Member> = f.members.iter().map(|m| (m.node.as_str(), m)).collect();
    let mut dropped: Vec<(String, DropReason)> = f
        .confirmed
        .iter()
        .filter_map(|n| {
            why_drop(by.get(n.as_str()).copied(), now, drop_after).map(|r| (n.clone(), r))
        })
        .collect();
    // what the set guarantees now: a newcomer must have at least that
    let member_acks: Option<Vec<&SnapshotId>> = f
        .confirmed
        .iter()
        .map(|n| by.get(n.as_str()).and_then(|m| m.acked.as_ref()))
        .collect();
    let target = match (member_acks.and_then(|a| a.into_iter().min()), &f.newest) {
        (Some(a), Some(n)) => Some(a.min(n)),
        (None, n) => n.as_ref(),
        (a, None) => a,
    };
    let added: Vec<String> = f
        .members
        .iter()
        .filter(|m| !f.confirmed.contains(&m.node) && m.connected)
        .filter(|m| why_drop(Some(m), now, drop_after).is_none())
        .filter(|m| {
            let keeps_up = m
                .behind_since
                .is_some_and(|t| now.saturating_duration_since(t) < CAUGHT_UP_WITHIN);
            match (&m.acked, target) {
                (Some(a), Some(t)) => a >= t || keeps_up,
                (Some(_), None) => true,
                (None, _) => false,
            }
        })
        .map(|m| m.node.clone())
        .collect();
    let mut set: BTreeSet<String> = f.confirmed.iter().cloned().collect();
    for (n, _) in &dropped {
        set.remove(n);
    }
    if set.is_empty() && added.is_empty() && !dropped.is_empty() {
        // strict: the last member stays (the one furthest ahead), and
        // writes wait for it
        let keep = f
            .confirmed
            .iter()
            .max_by(|a, b| {
                let aa = by.get(a.as_str()).and_then(|m| m.acked.clone());
                let bb = by.get(b.as_str()).and_then(|m| m.acked.clone());
                aa.cmp(&bb).then_with(|| b.cmp(a))
            })
            .cloned();
        if let Some(k) = keep {
            dropped.retain(|(n, _)| *n != k);
            set.insert(k);
        }
    }
    set.extend(added.iter().cloned());
    if dropped.is_empty() && added.is_empty() {
        return None;
    }
    Some(Change {
        set: set.into_iter().collect(),
        added,
        dropped,
    })
}

/// Whether a node may take the term after `epoch` (docs/failover.md, "Who
/// may be elected").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Eligible,
    /// etcd holds no in-sync set for a cluster that has terms.
    NoInSyncRecord,
    /// The set is of another term (the primary's record is not there yet).
    InSyncOfOtherTerm {
        insync_epoch: u64,
    },
    /// The primary of `epoch` did not (or no longer) wait for this node.
    NotInSync,
    /// Named, but its store is of another term (it was resynchronised whole
    /// since): it may lack acknowledged writes.
    StoreOfOtherTerm {
        store_epoch: u64,
    },
}

/// `store` is this node's lineage: the term of its store, and the newest
/// term it was elected for (the primary of the newest term is eligible
/// again: it holds every write it acknowledged, e.g. after a restart).
pub fn verdict(epoch: u64, insync: Option<&InSyncRecord>, me: &str, store: &Lineage) -> Verdict {
    if epoch == 0 {
        return Verdict::Eligible;
    }
    let Some(s) = insync else {
        return Verdict::NoInSyncRecord;
    };
    if s.epoch != epoch {
        return Verdict::InSyncOfOtherTerm {
            insync_epoch: s.epoch,
        };
    }
    // won `epoch`'s campaign but never began the term (the transaction's
    // reply was lost, or the node died before it recorded the term): no
    // write was acknowledged in `epoch`, and its store is the one that
    // made it eligible for `epoch`, of the term before
    let won_unbegun = s.primary.as_deref() == Some(me)
        && store.elected != Some(epoch)
        && store.epoch.checked_add(1) == Some(epoch);
    if won_unbegun {
        return Verdict::Eligible;
    }
    if !s.standbys.iter().any(|n| n == me) && store.elected != Some(epoch) {
        return Verdict::NotInSync;
    }
    if store.epoch != epoch {
        return Verdict::StoreOfOtherTerm {
            store_epoch: store.epoch,
        };
    }
    Verdict::Eligible
}

#[derive(Default)]
struct Board {
    term: u64,
    link: Option<Arc<ReplicationLink>>,
    /// Per standby node: its facts and its connection's id.
    members: HashMap<String, (Member, u64)>,
    /// As etcd holds it (confirmed by our own transaction).
    confirmed: Vec<String>,
    /// Sets being written, or whose write's outcome is unknown: required
    /// too until a later write of ours succeeds.
    pending: BTreeSet<String>,
}

/// The shared state (one per node; attached to a term's sender).
#[derive(Default)]
pub struct InSyncBoard {
    b: Mutex<Board>,
}

impl std::fmt::Debug for InSyncBoard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InSyncBoard").finish_non_exhaustive()
    }
}

impl InSyncBoard {
    fn lock(&self) -> std::sync::MutexGuard<'_, Board> {
        self.b.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The sender of `term` starts: the set is empty (the campaign wrote it so).
    pub fn attach(&self, term: u64, link: Arc<ReplicationLink>) {
        let mut b = self.lock();
        *b = Board {
            term,
            link: Some(link),
            ..Board::default()
        };
    }

    pub fn detach(&self) {
        *self.lock() = Board::default();
    }

    /// A standby joined on connection `conn`, holding `have`.
    pub fn joined(&self, node: &str, conn: u64, have: Option<SnapshotId>) {
        let mut b = self.lock();
        b.members.insert(
            node.to_string(),
            (
                Member {
                    node: node.to_string(),
                    acked: have,
                    connected: true,
                    since: Instant::now(),
                    behind_since: None,
                },
                conn,
            ),
        );
        release(&b);
    }

    pub fn acked(&self, node: &str, conn: u64, id: &SnapshotId) {
        let mut b = self.lock();
        if let Some((m, c)) = b.members.get_mut(node)
            && *c == conn
            && m.acked.as_ref().is_none_or(|a| a < id)
        {
            m.acked = Some(id.clone());
        }
        release(&b);
    }

    /// Connection `conn` of `node` ended (a newer one of the same node is
    /// not affected).
    pub fn left(&self, node: &str, conn: u64) {
        let mut b = self.lock();
        if let Some((m, c)) = b.members.get_mut(node)
            && *c == conn
        {
            m.connected = false;
            m.since = Instant::now();
        }
    }

    /// The facts for a decision (None: no term attached).
    pub fn facts(&self) -> Option<Facts> {
        let b = self.lock();
        let link = b.link.as_ref()?;
        let members = b
            .members
            .values()
            .map(|(m, _)| Member {
                behind_since: link.behind_since(m.acked.as_ref()),
                ..m.clone()
            })
            .collect();
        Some(Facts {
            term: b.term,
            confirmed: b.confirmed.clone(),
            members,
            newest: link.newest_committed(),
        })
    }

    pub fn term(&self) -> u64 {
        self.lock().term
    }

    /// Before writing `set` to etcd: its members are required from now on.
    pub fn begin(&self, set: &[String]) {
        let mut b = self.lock();
        b.pending.extend(set.iter().cloned());
    }

    /// etcd confirmed `set` (our write succeeded): it alone counts now.
    pub fn confirm(&self, term: u64, set: &[String]) {
        let mut b = self.lock();
        if b.term != term {
            return;
        }
        b.confirmed = set.to_vec();
        b.pending.clear();
        release(&b);
    }

    /// etcd holds `set` for `term`, as read (after a write whose outcome is
    /// unknown): what is pending stays required until a write succeeds.
    pub fn seen(&self, term: u64, set: &[String]) {
        let mut b = self.lock();
        if b.term == term {
            b.confirmed = set.to_vec();
        }
    }

    /// A write's outcome is unknown, or it failed: write again.
    pub fn unsettled(&self) -> bool {
        !self.lock().pending.is_empty()
    }

    /// The standbys whose acknowledgement counts now.
    pub fn required(&self) -> Vec<String> {
        let b = self.lock();
        required(&b).into_iter().collect()
    }

    pub fn confirmed(&self) -> Vec<String> {
        self.lock().confirmed.clone()
    }
}

fn required(b: &Board) -> BTreeSet<String> {
    let mut r: BTreeSet<String> = b.confirmed.iter().cloned().collect();
    r.extend(b.pending.iter().cloned());
    r
}

/// Tells the engine how far every required standby has acknowledged; none
/// required: nothing (strict: replies wait).
fn release(b: &Board) {
    let Some(link) = &b.link else { return };
    let req = required(b);
    if req.is_empty() {
        return;
    }
    let acks: Option<Vec<&SnapshotId>> = req
        .iter()
        .map(|n| b.members.get(n).and_then(|(m, _)| m.acked.as_ref()))
        .collect();
    if let Some(min) = acks.and_then(|a| a.into_iter().min()) {
        link.acked(min);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(seq: u64) -> SnapshotId {
        SnapshotId(format!("{seq:012}-20260101T000000Z"))
    }

    fn m(node: &str, acked: Option<u64>, connected: bool, t: Instant) -> Member {
        Member {
            node: node.into(),
            acked: acked.map(id),
            connected,
            since: t,
            behind_since: None,
        }
    }

    const AFTER: Duration = Duration::from_secs(1);

    #[test]
    fn a_caught_up_standby_is_added_and_a_new_term_starts_empty() {
        let t0 = Instant::now();
        let f = Facts {
            term: 2,
            confirmed: vec![],
            members: vec![m("a", Some(5), true, t0), m("b", Some(4), true, t0)],
            newest: Some(id(5)),
        };
        let c = decide(&f, t0, AFTER);
        assert_eq!(c.map(|c| c.set), Some(vec!["a".to_string()]));
        // b catches up with the set's slowest member: added too
        let f = Facts {
            confirmed: vec!["a".into()],
            members: vec![m("a", Some(6), true, t0), m("b", Some(6), true, t0)],
            newest: Some(id(7)),
            ..f
        };
        let c = decide(&f, t0, AFTER);
        assert_eq!(c.map(|c| c.added), Some(vec!["b".to_string()]));
        // nothing committed yet in the term: any acknowledgement will do
        let f = Facts {
            term: 3,
            confirmed: vec![],
            members: vec![m("a", None, true, t0), m("b", Some(5), true, t0)],
            newest: None,
        };
        assert_eq!(decide(&f, t0, AFTER).map(|c| c.set), Some(vec!["b".into()]));
        // one commit behind, but a recent one: it keeps up
        let mut b = m("b", Some(5), true, t0);
        b.behind_since = Some(t0);
        let f = Facts {
            term: 3,
            confirmed: vec![],
            members: vec![b.clone()],
            newest: Some(id(6)),
        };
        assert_eq!(
            decide(&f, t0 + CAUGHT_UP_WITHIN / 2, AFTER).map(|c| c.added),
            Some(vec!["b".into()])
        );
        assert_eq!(decide(&f, t0 + CAUGHT_UP_WITHIN, AFTER), None);
    }

    #[test]
    fn a_member_is_dropped_only_after_the_bound_and_never_the_last() {
        let t0 = Instant::now();
        let later = t0 + AFTER;
        let f = Facts {
            term: 2,
            confirmed: vec!["a".into(), "b".into()],
            members: vec![m("a", Some(5), true, t0), m("b", Some(5), false, t0)],
            newest: Some(id(5)),
        };
        assert_eq!(decide(&f, t0 + AFTER / 2, AFTER), None);
        let c = decide(&f, later, AFTER);
        assert_eq!(
            c,
            Some(Change {
                set: vec!["a".into()],
                added: vec![],
                dropped: vec![("b".into(), DropReason::Gone)],
            })
        );
        // behind (connected, acking heartbeats, but a commit waits)
        let mut slow = m("b", Some(4), true, t0);
        slow.behind_since = Some(t0);
        let f2 = Facts {
            members: vec![m("a", Some(5), true, t0), slow],
            ..f.clone()
        };
        assert_eq!(
            decide(&f2, later, AFTER).map(|c| c.dropped),
            Some(vec![("b".into(), DropReason::Behind)])
        );
        // both gone: the one furthest ahead stays
        let f3 = Facts {
            members: vec![m("a", Some(6), false, t0), m("b", Some(5), false, t0)],
            ..f
        };
        let c = decide(&f3, later, AFTER);
        assert_eq!(c.as_ref().map(|c| c.set.clone()), Some(vec!["a".into()]));
        // the last member alone: stays
        let f4 = Facts {
            confirmed: vec!["a".into()],
            members: vec![m("a", Some(6), false, t0)],
            ..f3
        };
        assert_eq!(decide(&f4, later, AFTER), None);
    }

    #[test]
    fn only_named_nodes_of_the_term_with_a_store_of_it_are_eligible() {
        let rec = InSyncRecord {
            epoch: 4,
            standbys: vec!["a".into()],
            primary: None,
        };
        let of4 = Lineage::whole(4);
        assert_eq!(verdict(0, None, "a", &Lineage::none()), Verdict::Eligible);
        assert_eq!(verdict(4, Some(&rec), "a", &of4), Verdict::Eligible);
        assert_eq!(verdict(4, Some(&rec), "b", &of4), Verdict::NotInSync);
        assert_eq!(verdict(4, None, "a", &of4), Verdict::NoInSyncRecord);
        assert_eq!(
            verdict(5, Some(&rec), "a", &of4),
            Verdict::InSyncOfOtherTerm { insync_epoch: 4 }
        );
        assert_eq!(
            verdict(4, Some(&rec), "a", &Lineage::none()),
            Verdict::StoreOfOtherTerm { store_epoch: 0 }
        );
        // the primary of term 4 itself (restarted): eligible while 4 is
        // the newest term, not once a newer one exists
        let mut primary = Lineage::whole(3).continue_with(4, Some(9));
        primary.elected = Some(4);
        assert_eq!(verdict(4, Some(&rec), "p", &primary), Verdict::Eligible);
        let newer = InSyncRecord {
            epoch: 5,
            standbys: vec!["a".into()],
            primary: None,
        };
        assert_eq!(verdict(5, Some(&newer), "p", &primary), Verdict::NotInSync);
    }

    /// The winner of a term's campaign that never began it (the reply to
    /// its transaction lost, as 30% packet loss did in
    /// test_failover_faults.py's flapping links; or a death right after):
    /// nobody else may take the next term, and it must, with the store it
    /// won with (of the term before).  Anyone else, or a store of another
    /// term, is still refused.
    #[test]
    fn the_winner_of_a_term_it_never_began_may_take_the_next() {
        let won = InSyncRecord {
            epoch: 2,
            standbys: Vec::new(),
            primary: Some("n2".into()),
        };
        let of1 = Lineage::whole(1);
        assert_eq!(verdict(2, Some(&won), "n2", &of1), Verdict::Eligible);
        // the old primary of 1, not named: refused as before
        let mut old = Lineage::whole(1);
        old.elected = Some(1);
        assert_eq!(verdict(2, Some(&won), "n1", &old), Verdict::NotInSync);
        // a store older than the term it campaigned from: refused
        assert_eq!(
            verdict(2, Some(&won), "n2", &Lineage::none()),
            Verdict::NotInSync
        );
        assert_eq!(
            verdict(
                3,
                Some(&InSyncRecord {
                    epoch: 3,
                    ..won.clone()
                }),
                "n2",
                &of1
            ),
            Verdict::NotInSync
        );
        // a record of an older rekindle names no primary: as before
        let legacy: InSyncRecord =
            serde_json::from_str(r#"{"epoch":2,"standbys":[]}"#).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(legacy.primary, None);
        assert_eq!(verdict(2, Some(&legacy), "n2", &of1), Verdict::NotInSync);
    }

    #[test]
    fn acknowledgements_are_released_only_with_every_required_member() {
        let link = Arc::new(ReplicationLink::new(true, None).unwrap_or_else(|e| panic!("{e}")));
        let b = InSyncBoard::default();
        b.attach(2, link.clone());
        b.joined("a", 1, None);
        b.acked("a", 1, &id(3));
        // not in the set yet: nothing released
        assert_eq!(link.take_acked(), None);
        b.begin(&["a".to_string()]);
        assert_eq!(link.take_acked(), None);
        b.confirm(2, &["a".to_string()]);
        assert_eq!(link.take_acked(), Some(id(3)));
        // b being added: required from before the write
        b.joined("b", 2, Some(id(3)));
        b.begin(&["a".to_string(), "b".to_string()]);
        b.acked("a", 1, &id(4));
        assert_eq!(link.take_acked(), Some(id(3)));
        b.acked("b", 2, &id(4));
        assert_eq!(link.take_acked(), Some(id(4)));
        // an old connection of b's does not count
        b.acked("b", 1, &id(9));
        b.acked("a", 1, &id(5));
        assert_eq!(link.take_acked(), Some(id(4)));
        // dropping b: still required until etcd confirms
        b.confirm(2, &["a".to_string(), "b".to_string()]);
        b.left("b", 2);
        b.begin(&["a".to_string()]);
        b.acked("a", 1, &id(6));
        assert_eq!(link.take_acked(), Some(id(4)));
        b.confirm(2, &["a".to_string()]);
        assert_eq!(link.take_acked(), Some(id(6)));
        assert_eq!(b.required(), vec!["a".to_string()]);
    }
}
