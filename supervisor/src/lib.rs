//! `rekindle`: the supervisor of librekindle apps.  See README.md and
//! docs/supervisor-protocol.md for the contract with the runtime.

pub mod app_link;
pub mod arena;
pub mod cli;
pub mod client;
pub mod clock;
pub mod cluster;
pub mod control_block;
pub mod control_socket;
pub mod decide;
pub mod event;
pub mod failure;
pub mod inspect;
pub mod lifecycle;
pub mod metrics;
pub mod notify;
pub mod orphan;
pub mod procfs;
pub mod proto;
pub mod reason;
pub mod redo;
pub mod runtime_dir;
pub mod signame;
pub mod snapshot;
pub mod spawn;
pub mod store;
pub mod store_cli;
pub mod supervisor;
