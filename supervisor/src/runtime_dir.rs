//! Where control sockets live: $REKINDLE_RUNTIME_DIR, else
//! $XDG_RUNTIME_DIR/rekindle, else /run/rekindle.  The directory is 0700.

use std::fs;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

pub fn dir() -> PathBuf {
    if let Some(d) = std::env::var_os("REKINDLE_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("rekindle");
    }
    PathBuf::from("/run/rekindle")
}

/// Where clients look: $REKINDLE_RUNTIME_DIR alone if set, else
/// $XDG_RUNTIME_DIR/rekindle and /run/rekindle (a root shell may have
/// XDG_RUNTIME_DIR set while system services use /run/rekindle).
pub fn search_dirs() -> Vec<PathBuf> {
    let first = dir();
    let mut v = vec![first.clone()];
    let overridden = std::env::var_os("REKINDLE_RUNTIME_DIR").is_some_and(|d| !d.is_empty());
    let system = PathBuf::from("/run/rekindle");
    if !overridden && first != system {
        v.push(system);
    }
    v
}

/// Creates the directory 0700 if needed; refuses one owned by someone else
/// (other than root for root) or open to others.
pub fn ensure(d: &Path) -> Result<()> {
    if !d.exists() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(d)
            .with_context(|| format!("creating {}", d.display()))?;
    }
    let md = fs::symlink_metadata(d).with_context(|| format!("{}", d.display()))?;
    if !md.is_dir() {
        bail!("{} is not a directory", d.display());
    }
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    if md.uid() != me {
        bail!(
            "{} belongs to uid {}, not to us (uid {me})",
            d.display(),
            md.uid()
        );
    }
    if md.mode() & 0o777 != 0o700 {
        fs::set_permissions(d, fs::Permissions::from_mode(0o700))
            .with_context(|| format!("chmod 0700 {}", d.display()))?;
    }
    Ok(())
}

/// Names become file names: letters, digits, '.', '_', '-', '@', at most 64,
/// not starting with '.'.
pub fn check_name(n: &str) -> Result<()> {
    let ok = !n.is_empty()
        && n.len() <= 64
        && !n.starts_with('.')
        && n.bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"._-@".contains(&c));
    if !ok {
        bail!(
            "invalid name {n:?}: use up to 64 letters, digits, '.', '_', '-', '@' (not starting with '.')"
        );
    }
    Ok(())
}

/// A name derived from the program's basename, made valid.
pub fn name_from_program(prog: &str) -> String {
    let base = Path::new(prog)
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut n: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-@".contains(c) {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    while n.starts_with('.') {
        n.remove(0);
    }
    if n.is_empty() { "app".into() } else { n }
}

pub fn socket_path(d: &Path, name: &str) -> PathBuf {
    d.join(format!("{name}.sock"))
}

pub fn notify_path(d: &Path, name: &str) -> PathBuf {
    d.join(format!("{name}.notify"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(check_name("svc").is_ok());
        assert!(check_name("my-app@1.v2_x").is_ok());
        assert!(check_name("").is_err());
        assert!(check_name("../x").is_err());
        assert!(check_name(".hidden").is_err());
        assert!(check_name(&"x".repeat(65)).is_err());
        assert_eq!(name_from_program("/usr/bin/my app"), "my_app");
        assert_eq!(name_from_program("..."), "app");
        assert_eq!(name_from_program("build/apps/service"), "service");
    }
}
