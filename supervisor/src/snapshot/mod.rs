//! Durable snapshots of a running app (docs/snapshots.md): the protocol
//! with the app's snapshot agent (`agent_link`), one snapshot from reports
//! to the store (`cut`, with `staging` for the pages copied out, and a
//! `baseline` for the first one after a restore), and the thread that
//! schedules them and owns the store (`engine`), which has the newest
//! snapshot's location index written off the app's path (`indexer`).

pub mod agent_link;
pub mod baseline;
pub mod cut;
pub mod engine;
pub mod indexer;
pub mod lazy;
pub mod restore;
pub mod staging;
