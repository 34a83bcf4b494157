//! Failover (issue 14, docs/failover.md): `rekindle run --cluster` on every
//! host; etcd elects the primary (a lease and a fencing epoch in etcd
//! transactions), the primary runs the app and streams each committed
//! snapshot to the standbys over TCP, a standby applies them into its own
//! store and, once elected, starts the app warm from the newest.
//!
//! - `args`: the command line (`run --cluster ...`, `rekindle cluster ...`).
//! - `error`: `ClusterError` and its stable codes.
//! - `records`: the keys under `/rekindle/<cluster>/` and their JSON values.
//! - `etcd`: the blocking façade over the async etcd client (one thread, a
//!   small tokio runtime per call site).
//! - `election`: the agent thread: campaign, lease keep-alive, self-fencing.
//! - `lineage`: which term a store, and each of its snapshots, came from.
//! - `insync`: the in-sync set (in etcd): whose acknowledgements count,
//!   who may be elected.
//! - `link`: the snapshot engine's hand-off to the replication sender
//!   (committed snapshots out, standby acknowledgements back).
//! - `wire`: the replication connection's control frames.
//! - `sender`, `receiver`: the two ends of the replication stream.
//! - `node`: the state machine of one host (standby, primary, fenced).
//! - `status`: `rekindle cluster status`.
//! - `switchover`: `rekindle failover` (planned).
//! - `resp`, `sentinel`: the Redis Sentinel subset clients use to find the
//!   primary, answered from etcd (`--sentinel-addr`, `rekindle sentinel`).

pub mod args;
pub mod election;
pub mod error;
pub mod etcd;
pub mod hot_image;
pub mod insync;
pub mod lineage;
pub mod link;
pub mod metrics;
pub mod node;
pub mod receiver;
pub mod records;
pub mod resp;
pub mod sender;
pub mod sentinel;
pub mod status;
pub mod switchover;
pub mod wire;
