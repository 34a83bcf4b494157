//! Command line: `rekindle run|status|ps|restart|stop|inspect` (clap derive), and the
//! value parsers for durations, sizes and listen addresses, and the
//! resolution of `rekindle run`'s arguments into a [`Config`].

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{Args, Parser, Subcommand};

use crate::runtime_dir;
use crate::spawn::{self, ProgramError};

#[derive(Debug, Parser)]
#[command(
    name = "rekindle",
    version,
    about = "Supervise a librekindle service: restart it warm, with its preserved state, whatever the death",
    long_about = None,
    propagate_version = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run PROGRAM under supervision, in the foreground.
    #[command(override_usage = "rekindle run [OPTIONS] [--] PROGRAM [ARGS]...")]
    Run(Box<RunArgs>),
    /// Run PROGRAM under supervision, starting warm from a durable snapshot
    /// (after a reboot, or on another machine).
    #[command(
        override_usage = "rekindle restore --from DIR[@ID|@TAG] [OPTIONS] [--] PROGRAM [ARGS]...",
        long_about = "Run PROGRAM under supervision like `rekindle run`, but the first incarnation \
 starts warm from a durable snapshot: its arenas, preserved ranges and \
 RK_PRESERVED statics are the snapshot's.  The app sees a warm start with \
 decision code `restored` and the snapshot's id in rk_restart_info.snapshot.\n\n\
 DIR is a snapshot store (rekindle run --snapshot-dir); @ID or @TAG picks a \
 snapshot, the newest by default.  A snapshot that fails its checks (a \
 torn, truncated or corrupt file) is refused with an error and nothing is \
 started: pick an earlier one.  Every option of `rekindle run` applies; with \
 --snapshot-dir the restored app goes on taking snapshots."
    )]
    Restore(Box<RestoreArgs>),
    /// Show the state of one running supervisor, or of all.
    Status {
        /// Supervisor name (default: all of them).
        name: Option<String>,
        /// Print the JSON the supervisor answered.
        #[arg(long)]
        json: bool,
    },
    /// List the running supervisors.
    Ps {
        /// Print a JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Ask a supervised app to restart (warm if it is safe, by default).
    Restart {
        /// Supervisor name.
        name: String,
        /// Restart warm if every check passes (the default).
        #[arg(long, conflicts_with = "cold")]
        warm: bool,
        /// Restart cold: drop the preserved state.
        #[arg(long)]
        cold: bool,
    },
    /// Stop a supervisor and its app (SIGTERM, then SIGKILL after --stop-timeout).
    Stop {
        /// Supervisor name.
        name: String,
    },
    /// Show what the app's preserved arenas hold: size, bytes allocated,
    /// objects by size class, roots, open unsafe regions.
    #[command(
        long_about = "Show what the app's preserved arenas hold, as read from the arena memfds \
 the supervisor holds (read-only, without stopping the app): per arena its \
 base address, reserved size, memfd size, heap carved, bytes allocated, \
 objects by size class, large objects, free page runs, roots (name, \
 address, the object they point at), allocator locks held and open unsafe \
 regions; and the app's pid, generation and start kind.\n\n\
 Nothing in an arena is trusted: what does not add up is listed under \
 problems, and the counts are then not exact.  Counts read while the app \
 allocates may differ from its own by what it is doing.\n\n\
 Exit status 1 when the supervisor cannot be reached or holds no arena \
 (the app does not use librekindle, or has opened none); --json prints \
 the reply then too, with an empty \"arenas\"."
    )]
    Inspect {
        /// Supervisor name.
        name: String,
        /// Print the JSON the supervisor answered.
        #[arg(long)]
        json: bool,
    },
    /// Restart a running app warm onto an earlier snapshot of its store.
    #[command(
        long_about = "Restart a running app warm onto a snapshot of the store it writes to \
                      (rekindle run --snapshot-dir): the newest, or the one named by ID or \
                      TAG.  The snapshot is read and checked first; a bad one is refused and \
                      the app keeps running.  Then the running incarnation is killed and the \
                      next one starts warm from the snapshot (decision code `restored`), as \
                      `rekindle restore` would start it.  Whatever the app changed since that \
                      snapshot is gone; the later snapshots stay in the store."
    )]
    Rollback {
        /// Supervisor name.
        name: String,
        /// A snapshot id or tag (default: the newest).
        snapshot: Option<String>,
        /// Print the JSON the supervisor answered.
        #[arg(long)]
        json: bool,
    },
    /// Hand a cluster's primary over to a standby (planned, no acknowledged
    /// write lost; docs/failover.md).
    Failover(crate::cluster::args::FailoverArgs),
    /// Answer the Redis Sentinel protocol subset clients use to find a
    /// cluster's primary, from etcd (docs/failover.md).
    Sentinel(crate::cluster::args::SentinelArgs),
    /// Failover clusters: `rekindle cluster status` (docs/failover.md).
    #[command(subcommand)]
    Cluster(crate::cluster::args::ClusterCommand),
    /// Snapshot store commands (snapshots, verify, gc, send, recv).
    #[command(flatten)]
    Store(crate::store_cli::StoreCommand),
    /// Take one durable snapshot of a running app now (it must run with
    /// --snapshot-dir).
    #[command(
        long_about = "Take one durable snapshot of a running app now.  The app must run under `rekindle run --snapshot-dir DIR`.  The snapshot is a consistent cut: taken when no unsafe region of the app is open.\n\n Without --wait the request is queued and the command returns at once; with --wait it returns when the snapshot is published in the store and synced to disk, and prints its id.  Exit status 1 if the snapshot could not be taken (the reason and its code are printed)."
    )]
    Checkpoint {
        /// Supervisor name.
        name: String,
        /// Tag the snapshot (repeatable); `rekindle restore --from DIR@TAG` finds it.
        #[arg(long = "tag", value_name = "TAG")]
        tags: Vec<String>,
        /// Return when the snapshot is durable, not when it is queued.
        #[arg(long)]
        wait: bool,
        /// Print the JSON the supervisor answered.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// The snapshot: a store directory, optionally @ID or @TAG.
    #[arg(long, value_name = "DIR[@ID|@TAG]")]
    pub from: String,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Name of this supervisor (control socket NAME.sock); default: PROGRAM's basename.
    #[arg(long)]
    pub name: Option<String>,

    /// A heartbeat (rk_heartbeat, or WATCHDOG=1) silent this long is a hang; 0 = off.
    #[arg(long, value_name = "DUR", value_parser = parse_duration, default_value = "0")]
    pub hang_timeout: Duration,

    /// After asking for a restart by signal, wait this long for the new HELLO, then SIGKILL.
    #[arg(long, value_name = "DUR", value_parser = parse_duration, default_value = "1s")]
    pub kill_timeout: Duration,

    /// Private memory (RssAnon) above this is a leak: warm restart to rejuvenate. Arenas do not count.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub max_rss: Option<u64>,

    /// How often to check the heartbeat and RSS.
    #[arg(long, value_name = "DUR", value_parser = parse_duration, default_value = "500ms")]
    pub check_interval: Duration,

    /// A failure this soon after a warm restart restarts cold; 0 = off (also passed to the runtime).
    #[arg(long, value_name = "DUR", value_parser = parse_duration, default_value = "1s")]
    pub crashloop_window: Duration,

    /// Restart at most N times in a row; the next consecutive failure gives up (exit 1).
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub max_restarts: u32,

    /// An incarnation that ran this long before failing resets the failure count and backoff.
    #[arg(long, value_name = "DUR", value_parser = parse_duration, default_value = "10s")]
    pub stable_after: Duration,

    /// Delay before the second consecutive respawn; doubles with each further failure.
    #[arg(long, value_name = "DUR", value_parser = parse_duration, default_value = "100ms")]
    pub backoff_initial: Duration,

    /// Upper bound of the respawn delay.
    #[arg(long, value_name = "DUR", value_parser = parse_duration, default_value = "30s")]
    pub backoff_max: Duration,

    /// On stop, how long the app has after SIGTERM before SIGKILL.
    #[arg(long, value_name = "DUR", value_parser = parse_duration, default_value = "10s")]
    pub stop_timeout: Duration,

    /// Listening socket the supervisor holds and hands to every incarnation
    /// as LISTEN_FDS (fd 3, 4, ...): [tcp:]HOST:PORT or unix:PATH. Repeatable.
    #[arg(long, value_name = "ADDR", value_parser = parse_listen)]
    pub listen: Vec<ListenAddr>,

    /// Append the JSON event lines to FILE instead of stderr.
    #[arg(long, value_name = "FILE")]
    pub events: Option<PathBuf>,

    /// Serve Prometheus metrics at http://HOST:PORT/metrics.
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics: Option<String>,

    /// Signal that asks the runtime to restart (REKINDLE_RESTART_SIGNAL); a real-time signal.
    #[arg(long, value_name = "N", default_value_t = 40, value_parser = parse_rt_signal)]
    pub restart_signal: i32,

    /// Take continuous durable snapshots of the preserved state into this
    /// store directory (created if missing; see `rekindle snapshots`).
    #[arg(long, value_name = "DIR")]
    pub snapshot_dir: Option<PathBuf>,

    /// With --snapshot-dir: take a snapshot this often (down to 10ms); 0 =
    /// only on `rekindle checkpoint`.
    #[arg(long, value_name = "DUR", value_parser = parse_duration, default_value = "1s",
          requires = "snapshot_dir")]
    pub snapshot_interval: Duration,

    /// With --snapshot-dir: keep only the newest N snapshots (older ones are
    /// folded away and their space freed after each published snapshot and
    /// each fold of the journal when the app is idle).
    #[arg(long, value_name = "N", requires = "snapshot_dir", value_parser = clap::value_parser!(u64).range(1..))]
    pub snapshot_keep: Option<u64>,

    /// With --snapshot-interval: continuous snapshots go to the store's
    /// journal (one append and one fdatasync each: durable, and restored
    /// after a crash), and are published as listed snapshots (`rekindle
    /// snapshots`, rollback, send, --snapshot-keep) at most this often, in
    /// the background; at least the interval.  A snapshot after one of more
    /// than 8,192 pages is published at once.  0 (the default): each one is
    /// published (a pack, a map, a manifest: three fsync rounds).
    #[arg(long, value_name = "DUR", value_parser = parse_duration, default_value = "0",
          requires = "snapshot_dir")]
    pub snapshot_publish_every: Duration,

    /// While the app logs its changes in the redo log (rk_redo_append, rkv
    /// --durability sync --sync-via redo), an interval snapshot waits until
    /// this much was logged since the last one: the log keeps the writes
    /// durable, and a snapshot only bounds what a restore replays.
    #[arg(long, value_name = "SIZE", value_parser = parse_size, default_value = "64M",
          requires = "snapshot_dir")]
    pub redo_snapshot_bytes: u64,

    /// With --snapshot-dir: at most this much copied page data held in
    /// memory while a snapshot is taken; beyond it pages go to the store
    /// early (the cut then takes longer).
    #[arg(long, value_name = "SIZE", value_parser = parse_size, default_value = "64M",
          requires = "snapshot_dir")]
    pub snapshot_memory: u64,

    /// With --snapshot-dir: a `snapshot` event for every snapshot (every),
    /// or for continuous ones at most once a second (sampled).
    #[arg(
        long,
        value_name = "WHICH",
        value_enum,
        default_value = "sampled",
        requires = "snapshot_dir"
    )]
    pub snapshot_events: SnapshotEvents,

    /// With --snapshot-dir, what the first incarnation starts from: the
    /// newest snapshot in the store if it holds one (newest: after a reboot
    /// the app comes back with its state; a store that cannot be read is
    /// an error, not an empty start), or nothing (empty).  `rekindle
    /// restore --from DIR@ID` starts from a chosen one.
    #[arg(
        long,
        value_name = "WHAT",
        value_enum,
        default_value = "newest",
        requires = "snapshot_dir"
    )]
    pub start_from: StartFrom,

    /// How a start from a snapshot (`rekindle restore`, --start-from
    /// newest) reads the arenas back: every page before the app starts
    /// (eager), or none: the app starts at once and each page comes in when
    /// it is first touched, the rest in the background (lazy; needs a
    /// userfaultfd that sees kernel faults: root, CAP_SYS_PTRACE or
    /// /dev/userfaultfd, else eager with a `lazy_restore` event saying so).
    #[arg(long, value_name = "HOW", value_enum, default_value = "eager")]
    pub restore_pages: crate::snapshot::restore::Pages,

    /// With --restore-pages lazy: at most this many pages a second read
    /// back in the background, to spare the disk (0: as fast as it goes).
    /// Pages the app touches come in at once whatever it is.
    #[arg(long, value_name = "PAGES", default_value_t = 0)]
    pub restore_fill_rate: u64,

    /// The program to supervise and its arguments (after `--`).  Once
    /// PROGRAM is found, everything after it is its argument; before it, a
    /// word that starts with '-' is an option of ours (unknown ones are a
    /// usage error: use `--` to run a program whose name starts with '-').
    #[arg(value_name = "PROGRAM", required = true, trailing_var_arg = true, num_args = 1..)]
    pub command: Vec<OsString>,

    /// Failover: `--cluster ENDPOINTS --node ID ...` (docs/failover.md).
    #[command(flatten)]
    pub cluster: crate::cluster::args::ClusterArgs,
}

/// Settings of one `rekindle run`, resolved.
pub struct Config {
    pub name: String,
    pub program_display: String,
    pub program_path: PathBuf,
    pub args: Vec<OsString>,
    pub hang_timeout: Duration,
    pub kill_timeout: Duration,
    pub max_rss: Option<u64>,
    pub check_interval: Duration,
    pub crashloop_window: Duration,
    pub max_restarts: u32,
    pub stable_after: Duration,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    pub stop_timeout: Duration,
    pub listen: Vec<ListenAddr>,
    pub events: Option<PathBuf>,
    pub metrics: Option<String>,
    pub restart_signal: i32,
    pub snapshots: Option<SnapshotConfig>,
    /// `rekindle restore --from`, or the store's newest (`--start-from`).
    pub restore: Option<crate::snapshot::restore::Source>,
    /// Why the first incarnation starts from `restore` (the restore event).
    pub restore_why: &'static str,
    /// `restore`'s snapshot already in memfds (an elected standby's hot
    /// image, cluster/hot_image.rs): used instead of reading the store.
    pub restored: Option<crate::snapshot::restore::Restored>,
    /// The store at `--snapshot-dir`, already open with its indexes (an
    /// elected standby's, from its receiver): the snapshot engine starts
    /// from it instead of reading every pack's index again.
    pub store: Option<crate::store::preopened::Preopened>,
    pub start_from: StartFrom,
    pub restore_pages: crate::snapshot::restore::Pages,
    pub restore_fill_rate: u64,
    /// `--cluster`: the replication sender's link to the snapshot engine.
    pub replication: Option<std::sync::Arc<crate::cluster::link::ReplicationLink>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StartFrom {
    Newest,
    Empty,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SnapshotEvents {
    Every,
    Sampled,
}

/// `--snapshot-*`, resolved.
#[derive(Debug, Clone)]
pub struct SnapshotConfig {
    pub events: SnapshotEvents,
    pub dir: PathBuf,
    /// None: only on request.
    pub interval: Option<Duration>,
    pub keep: Option<usize>,
    pub memory: usize,
    /// `--snapshot-publish-every`: None, every snapshot is published.
    pub publish_every: Option<Duration>,
    /// `--redo-snapshot-bytes`.
    pub redo_snapshot_bytes: u64,
}

/// Why `rekindle run`'s arguments cannot be used (a usage error: exit 2).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    Program(#[from] ProgramError),
    #[error("{0}")]
    Name(String),
    #[error("{0}")]
    Snapshots(String),
}

impl Config {
    /// Finds PROGRAM and settles the name; the check interval is at least
    /// 10 ms, so a zero cannot make the poll loop spin.
    pub fn from_args(a: RunArgs) -> Result<Self, ConfigError> {
        let prog = a.command.first().cloned().unwrap_or_default();
        let program_path = spawn::resolve_program(&prog)?;
        let program_display = prog.to_string_lossy().into_owned();
        let name = match a.name {
            Some(n) => n,
            None => runtime_dir::name_from_program(&program_display),
        };
        runtime_dir::check_name(&name).map_err(|e| ConfigError::Name(e.to_string()))?;
        let interval = (!a.snapshot_interval.is_zero())
            .then(|| a.snapshot_interval.max(Duration::from_millis(10)));
        let publish_every =
            (!a.snapshot_publish_every.is_zero()).then_some(a.snapshot_publish_every);
        match (publish_every, interval) {
            (Some(_), None) => {
                return Err(ConfigError::Snapshots(
                    "--snapshot-publish-every needs continuous snapshots (--snapshot-interval above 0)"
                        .into(),
                ));
            }
            (Some(p), Some(i)) if p < i => {
                return Err(ConfigError::Snapshots(format!(
                    "--snapshot-publish-every ({p:?}) is shorter than --snapshot-interval ({i:?})"
                )));
            }
            _ => {}
        }
        Ok(Config {
            name,
            program_display,
            program_path,
            args: a.command,
            hang_timeout: a.hang_timeout,
            kill_timeout: a.kill_timeout,
            max_rss: a.max_rss,
            check_interval: a.check_interval.max(Duration::from_millis(10)),
            crashloop_window: a.crashloop_window,
            max_restarts: a.max_restarts,
            stable_after: a.stable_after,
            backoff_initial: a.backoff_initial,
            backoff_max: a.backoff_max,
            stop_timeout: a.stop_timeout,
            listen: a.listen,
            events: a.events,
            metrics: a.metrics,
            restart_signal: a.restart_signal,
            snapshots: a.snapshot_dir.map(|dir| SnapshotConfig {
                events: a.snapshot_events,
                dir,
                interval,
                keep: a.snapshot_keep.map(|k| k as usize),
                memory: a.snapshot_memory.max(1 << 20) as usize,
                publish_every,
                redo_snapshot_bytes: a.redo_snapshot_bytes,
            }),
            restore: None,
            restore_why: "",
            restored: None,
            store: None,
            start_from: a.start_from,
            restore_pages: a.restore_pages,
            restore_fill_rate: a.restore_fill_rate,
            replication: None,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    Tcp(String),
    Unix(PathBuf),
}

impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListenAddr::Tcp(a) => write!(f, "tcp:{a}"),
            ListenAddr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// The text for a usage error that clap words as "unexpected argument" when
/// the argument is an option we do not know: "unknown option '--bogus'",
/// then clap's usage lines.  None for every other error (clap's own text).
pub fn unknown_option_text(e: &clap::Error) -> Option<String> {
    if e.kind() != ErrorKind::UnknownArgument {
        return None;
    }
    let arg = match e.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(s)) if s.starts_with('-') => s.clone(),
        _ => return None,
    };
    let rendered = e.render().to_string();
    let usage = rendered
        .find("Usage:")
        .map(|i| rendered[i..].trim_end().to_string())
        .unwrap_or_default();
    Some(format!("rekindle: unknown option '{arg}'\n\n{usage}\n"))
}

/// `500ms`, `2s`, `1m`, `1h 30m`, or `0`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err("empty duration".into());
    }
    if t.bytes().all(|c| c == b'0') {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(t).map_err(|e| format!("{s:?}: {e} (examples: 500ms, 2s, 1m)"))
}

/// `512M`, `2G`, `64MiB`, `1048576`; binary units (K = 1024).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    if digits == 0 {
        return Err(format!(
            "{s:?}: expected a number with an optional unit (512M, 2G)"
        ));
    }
    let n: u64 = t[..digits].parse().map_err(|e| format!("{s:?}: {e}"))?;
    let unit = t[digits..].trim().to_ascii_lowercase();
    let unit = unit
        .strip_suffix("ib")
        .or_else(|| unit.strip_suffix('b'))
        .unwrap_or(&unit);
    let mult: u64 = match unit {
        "" => 1,
        "k" => 1 << 10,
        "m" => 1 << 20,
        "g" => 1 << 30,
        "t" => 1 << 40,
        _ => return Err(format!("{s:?}: unknown unit (use K, M, G or T)")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("{s:?}: too large"))
}

/// `[tcp:]HOST:PORT` or `unix:PATH`.
pub fn parse_listen(s: &str) -> Result<ListenAddr, String> {
    if let Some(p) = s.strip_prefix("unix:") {
        if p.is_empty() {
            return Err("unix: needs a path".into());
        }
        return Ok(ListenAddr::Unix(PathBuf::from(p)));
    }
    let a = s.strip_prefix("tcp:").unwrap_or(s);
    match a.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
            Ok(ListenAddr::Tcp(a.to_string()))
        }
        _ => Err(format!("{s:?}: expected [tcp:]HOST:PORT or unix:PATH")),
    }
}

fn parse_rt_signal(s: &str) -> Result<i32, String> {
    let n: i32 = s.parse().map_err(|e| format!("{s:?}: {e}"))?;
    let (lo, hi) = (libc::SIGRTMIN(), libc::SIGRTMAX());
    if n < lo || n > hi {
        return Err(format!("{n} is not a real-time signal ({lo}..={hi})"));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("0ms"), Ok(Duration::ZERO));
        assert!(parse_duration("").is_err());
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("64mb"), Ok(64 << 20));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1k"), Ok(1024));
        assert!(parse_size("M").is_err());
        assert!(parse_size("12X").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn listen_addresses() {
        assert_eq!(
            parse_listen("127.0.0.1:80"),
            Ok(ListenAddr::Tcp("127.0.0.1:80".into()))
        );
        assert_eq!(
            parse_listen("tcp:[::1]:80"),
            Ok(ListenAddr::Tcp("[::1]:80".into()))
        );
        assert_eq!(
            parse_listen("unix:/tmp/s"),
            Ok(ListenAddr::Unix("/tmp/s".into()))
        );
        assert!(parse_listen("localhost").is_err());
        assert!(parse_listen("h:99999").is_err());
        assert!(parse_listen("unix:").is_err());
    }

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
        let c = Cli::try_parse_from([
            "rekindle",
            "run",
            "--max-rss",
            "1G",
            "--",
            "sleep",
            "-x",
            "2",
        ]);
        let c = c.map_err(|e| e.to_string());
        match c.map(|c| c.cmd) {
            Ok(Command::Run(r)) => {
                assert_eq!(r.max_rss, Some(1 << 30));
                assert_eq!(r.command, vec!["sleep", "-x", "2"]);
            }
            other => panic!("{other:?}"),
        }
        assert!(Cli::try_parse_from(["rekindle", "run"]).is_err());
        assert!(Cli::try_parse_from(["rekindle", "restart", "x", "--warm", "--cold"]).is_err());
        assert!(
            Cli::try_parse_from(["rekindle", "run", "--restart-signal", "9", "--", "x"]).is_err()
        );
    }

    #[test]
    fn an_unknown_option_is_not_taken_for_the_program() {
        let e = Cli::try_parse_from(["rekindle", "run", "--bogus", "--", "/bin/true"])
            .err()
            .unwrap_or_else(|| panic!("--bogus was accepted"));
        let text = unknown_option_text(&e).unwrap_or_default();
        assert!(
            text.starts_with("rekindle: unknown option '--bogus'"),
            "{text}"
        );
        assert!(text.contains("Usage: rekindle run"), "{text}");
        // after PROGRAM, and after `--`, words with '-' belong to the program
        for argv in [
            &["rekindle", "run", "sh", "-c", "true", "--bogus"][..],
            &["rekindle", "run", "--", "-weird-name", "-x"],
        ] {
            let c = Cli::try_parse_from(argv).map_err(|e| e.to_string());
            assert!(matches!(c.map(|c| c.cmd), Ok(Command::Run(_))), "{argv:?}");
        }
        // other usage errors keep clap's own words
        let e = Cli::try_parse_from(["rekindle", "run", "--max-rss", "lots", "--", "x"])
            .err()
            .unwrap_or_else(|| panic!("accepted"));
        assert_eq!(unknown_option_text(&e), None);
    }

    fn run_args(argv: &[&str]) -> RunArgs {
        let mut full = vec!["rekindle", "run"];
        full.extend_from_slice(argv);
        match Cli::try_parse_from(full).map(|c| c.cmd) {
            Ok(Command::Run(r)) => *r,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn config_resolves_program_name_and_floors() {
        let c = Config::from_args(run_args(&["--check-interval", "0", "--", "sh", "-c", "x"]))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.name, "sh");
        assert_eq!(c.program_display, "sh");
        assert!(c.program_path.is_absolute(), "{:?}", c.program_path);
        assert_eq!(c.args, vec!["sh", "-c", "x"]);
        assert_eq!(c.check_interval, Duration::from_millis(10));
        assert_eq!(c.kill_timeout, Duration::from_secs(1));
        let c = Config::from_args(run_args(&["--name", "web@1", "--", "sh"]))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.name, "web@1");
        let e = Config::from_args(run_args(&["--name", ".hidden", "--", "sh"]));
        assert!(matches!(e, Err(ConfigError::Name(ref m)) if m.contains("invalid name")));
        let e = Config::from_args(run_args(&["--", "/no/such/program"]));
        assert!(matches!(
            e,
            Err(ConfigError::Program(ProgramError::NotFound(_)))
        ));
    }

    #[test]
    fn publish_every_needs_an_interval_it_is_not_shorter_than() {
        let cfg = |argv: &[&str]| Config::from_args(run_args(argv));
        let every = |c: &Config| c.snapshots.as_ref().and_then(|s| s.publish_every);
        let c = cfg(&[
            "--snapshot-dir",
            "d",
            "--snapshot-interval",
            "10ms",
            "--",
            "sh",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(every(&c), None, "0 (the default) publishes each snapshot");
        let c = cfg(&[
            "--snapshot-dir",
            "d",
            "--snapshot-interval",
            "10ms",
            "--snapshot-publish-every",
            "10ms",
            "--",
            "sh",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(every(&c), Some(Duration::from_millis(10)));
        for (argv, says) in [
            (
                &[
                    "--snapshot-dir",
                    "d",
                    "--snapshot-interval",
                    "1s",
                    "--snapshot-publish-every",
                    "999ms",
                    "--",
                    "sh",
                ][..],
                "shorter than --snapshot-interval",
            ),
            (
                &[
                    "--snapshot-dir",
                    "d",
                    "--snapshot-interval",
                    "0",
                    "--snapshot-publish-every",
                    "1s",
                    "--",
                    "sh",
                ],
                "needs continuous snapshots",
            ),
        ] {
            match cfg(argv) {
                Err(ConfigError::Snapshots(m)) => assert!(m.contains(says), "{m}"),
                other => panic!("{argv:?}: {:?}", other.map(|c| c.name)),
            }
        }
    }
}
