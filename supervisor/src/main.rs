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
    cfg.restore = restore;
    match supervisor::Supervisor::new(cfg) {
        Ok(s) => std::process::exit(s.run()),
        Err(e) => {
            eprintln!("rekindle: {e:#}");
            std::process::exit(1);
        }
    }
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
    let r = match cli.cmd {
        Command::Run(args) => supervise(*args, None),
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
