use clap::Parser;

use rekindle::cli::{self, Cli, Command};
use rekindle::{client, supervisor};

/// `rekindle run`, or `rekindle restore` with the snapshot to start from:
/// runs the supervisor in the foreground; bad arguments exit 2, a
/// supervisor that cannot start exits 1.
fn supervise(args: cli::RunArgs, restore: Option<rekindle::snapshot::restore::Source>) -> ! {
    let mut cfg = match cli::Config::from_args(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rekindle: {e:#}");
            std::process::exit(2);
        }
    };
    cfg.restore_why = "rekindle restore --from";
    cfg.restore = match restore {
        Some(r) => Some(r),
        None => start_from_store(&mut cfg),
    };
    match supervisor::Supervisor::new(cfg) {
        Ok(s) => std::process::exit(s.run()),
        Err(e) => {
            eprintln!("rekindle: {e:#}");
            std::process::exit(1);
        }
    }
}

/// `run --snapshot-dir DIR` with `--start-from newest`: the store's newest
/// snapshot, or None when there is no store or it holds none yet.  A store
/// that cannot be read exits 1: starting empty would hide the state it holds.
fn start_from_store(cfg: &mut cli::Config) -> Option<rekindle::snapshot::restore::Source> {
    let sc = cfg.snapshots.as_ref()?;
    if cfg.start_from == cli::StartFrom::Empty {
        return None;
    }
    let is_empty_dir = |d: &std::path::Path| d.read_dir().map(|mut r| r.next().is_none());
    if !sc.dir.exists() || is_empty_dir(&sc.dir).unwrap_or(false) {
        return None; // the first run: the store begins now
    }
    // a journal's records (acknowledged writes) may be the newest state
    let folded = rekindle::store::fold::fold_journal_at(&sc.dir);
    match folded.and_then(|_| rekindle::store::Store::open_unindexed(&sc.dir)?.latest()) {
        Ok(None) => None,
        Ok(Some(_)) => {
            cfg.restore_why =
                "the store holds snapshots: starting from the newest (--start-from newest)";
            Some(rekindle::snapshot::restore::Source {
                dir: sc.dir.clone(),
                spec: String::new(),
            })
        }
        Err(e) => {
            eprintln!(
                "rekindle: cannot read the snapshot store {}: {e} ({}); refusing to start so that its \
                 state is not replaced (--start-from empty starts without it)",
                sc.dir.display(),
                e.code()
            );
            std::process::exit(1);
        }
    }
}

/// Commands whose only output is a listing, read by a person or piped
/// into `head`: a reader that closes early ends them quietly.
fn prints_a_listing(cmd: &Command) -> bool {
    matches!(
        cmd,
        Command::Status { .. }
            | Command::Ps { .. }
            | Command::Inspect { .. }
            | Command::Store(rekindle::store_cli::StoreCommand::Snapshots { .. })
    )
}

/// Rust ignores SIGPIPE, so a listing written to a closed pipe panicked in
/// `println!`; the default action ends the process as other tools end.
fn quiet_on_closed_stdout() {
    // SAFETY: restoring the default disposition of one signal at start.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}

fn main() {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => match cli::unknown_option_text(&e) {
            Some(text) => {
                eprint!("{text}");
                std::process::exit(2);
            }
            None => e.exit(), // usage errors exit 2, --help and --version 0
        },
    };
    if prints_a_listing(&cli.cmd) {
        quiet_on_closed_stdout();
    }
    let r = match cli.cmd {
        Command::Run(args) if args.cluster.cluster.is_some() => {
            std::process::exit(rekindle::cluster::node::run(*args))
        }
        Command::Run(args) => supervise(*args, None),
        Command::Cluster(c) => Ok(rekindle::cluster::args::run_command(c)),
        Command::Failover(a) => Ok(rekindle::cluster::args::failover(a)),
        Command::Sentinel(a) => Ok(rekindle::cluster::args::sentinel(a)),
        Command::Restore(args) => {
            let from = rekindle::snapshot::restore::Source::parse(&args.from);
            supervise(args.run, Some(from))
        }
        Command::Status { name, json } => client::status(name.as_deref(), json),
        Command::Ps { json } => client::ps(json),
        Command::Restart {
            name,
            warm: _,
            cold,
        } => client::restart(&name, cold),
        Command::Stop { name } => client::stop(&name),
        Command::Inspect { name, json } => client::inspect(&name, json),
        Command::Store(c) => Ok(rekindle::store_cli::run(c)),
        Command::Rollback {
            name,
            snapshot,
            json,
        } => client::rollback(&name, snapshot.as_deref().unwrap_or(""), json),
        Command::Checkpoint {
            name,
            tags,
            wait,
            json,
        } => client::checkpoint(&name, &tags, wait, json),
    };
    match r {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("rekindle: {e:#}");
            std::process::exit(1);
        }
    }
}
