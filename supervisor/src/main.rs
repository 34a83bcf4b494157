use clap::Parser;

use rekindle::cli::{self, Cli, Command};
use rekindle::{client, supervisor};

fn snapshot_source(s: &str) -> rekindle::snapshot::restore::Source {
    rekindle::snapshot::restore::Source::parse(s)
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
        Command::Run(args) => match cli::Config::from_args(*args) {
            Ok(cfg) => match supervisor::Supervisor::new(cfg) {
                Ok(s) => Ok(s.run()),
                Err(e) => {
                    eprintln!("rekindle: {e:#}");
                    std::process::exit(1);
                }
            },
            Err(e) => {
                eprintln!("rekindle: {e:#}");
                std::process::exit(2);
            }
        },
        Command::Restore(args) => {
            let from = snapshot_source(&args.from);
            match cli::Config::from_args(args.run) {
                Ok(mut cfg) => {
                    cfg.restore = Some(from);
                    match supervisor::Supervisor::new(cfg) {
                        Ok(s) => Ok(s.run()),
                        Err(e) => {
                            eprintln!("rekindle: {e:#}");
                            std::process::exit(1);
                        }
                    }
                }
                Err(e) => {
                    eprintln!("rekindle: {e:#}");
                    std::process::exit(2);
                }
            }
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
