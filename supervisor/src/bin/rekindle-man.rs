//! Writes the man pages of `rekindle` and each of its commands, generated
//! from the same clap definition as `--help`, into the directory given
//! (`make install` puts them under PREFIX/share/man/man1).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::CommandFactory;
use rekindle::cli::Cli;

fn main() -> ExitCode {
    let Some(dir) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: rekindle-man DIR");
        return ExitCode::from(2);
    };
    match write_pages(&dir) {
        Ok(n) => {
            eprintln!("rekindle-man: {n} pages in {}", dir.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rekindle-man: {}: {e}", dir.display());
            ExitCode::FAILURE
        }
    }
}

/// `rekindle.1`, then `rekindle-run.1`, `rekindle-status.1`, ...
fn write_pages(dir: &std::path::Path) -> std::io::Result<usize> {
    std::fs::create_dir_all(dir)?;
    let top = Cli::command();
    let mut n = 0;
    let mut page = |cmd: clap::Command, file: String| -> std::io::Result<()> {
        let mut out = Vec::new();
        clap_mangen::Man::new(cmd).render(&mut out)?;
        std::fs::write(dir.join(file), out)?;
        n += 1;
        Ok(())
    };
    // hidden commands (the store's test helpers) get no page
    for sub in top.get_subcommands().filter(|s| !s.is_hide_set()) {
        // a static name: clap's builder takes &'static str (this program
        // runs once and exits)
        let name: &'static str = Box::leak(format!("rekindle-{}", sub.get_name()).into_boxed_str());
        page(sub.clone().name(name), format!("{name}.1"))?;
    }
    page(top, "rekindle.1".into())?;
    Ok(n)
}
