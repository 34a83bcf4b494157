//! A store already open with its chunk indexes, handed to the snapshot
//! engine or the replication sender of a newly elected primary: either now,
//! or still being copied on a thread of its own (`Store::duplicate` of a
//! big store takes tens of ms, which the app's start need not wait for).

use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

use super::Store;

pub enum Preopened {
    Ready(Box<Store>),
    /// Sent once made; a dropped sender (the copy failed or panicked)
    /// means "open it yourself".
    Coming(Receiver<Store>),
}

impl Preopened {
    /// A pair: what will be sent, and where it is taken.
    pub fn coming() -> (SyncSender<Store>, Preopened) {
        let (tx, rx) = sync_channel(1);
        (tx, Preopened::Coming(rx))
    }

    /// The store, waiting for it if it is still being made; None if it
    /// never came (the caller opens the store itself).
    pub fn take(self) -> Option<Store> {
        match self {
            Preopened::Ready(s) => Some(*s),
            Preopened::Coming(rx) => rx.recv().ok(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_still_coming_is_waited_for_and_a_lost_one_is_none() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let (tx, pre) = Preopened::coming();
        let d = dir.path().to_path_buf();
        let t = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            let s = Store::create_or_open(&d).unwrap_or_else(|e| panic!("{e}"));
            tx.send(s).unwrap_or_else(|e| panic!("{e}"));
        });
        assert!(pre.take().is_some());
        t.join().unwrap_or_else(|_| panic!("sender thread"));
        let (tx, pre) = Preopened::coming();
        drop(tx);
        assert!(pre.take().is_none());
    }
}
