//! Where control sockets live: $REKINDLE_RUNTIME_DIR, else
//! $XDG_RUNTIME_DIR/rekindle, else /run/rekindle.  The directory is 0700.

use std::fs;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

/// Where `dir()` came from: it decides the hint of an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// $REKINDLE_RUNTIME_DIR
    Rekindle,
    /// $XDG_RUNTIME_DIR/rekindle
    Xdg,
    /// /run/rekindle, the system default
    System,
}

fn env_dir(var: &str) -> Option<std::ffi::OsString> {
    std::env::var_os(var).filter(|d| !d.is_empty())
}

/// The runtime directory and where it came from.
pub fn dir_with_source() -> (PathBuf, Source) {
    if let Some(d) = env_dir("REKINDLE_RUNTIME_DIR") {
        return (PathBuf::from(d), Source::Rekindle);
    }
    if let Some(d) = env_dir("XDG_RUNTIME_DIR") {
        return (PathBuf::from(d).join("rekindle"), Source::Xdg);
    }
    (PathBuf::from("/run/rekindle"), Source::System)
}

pub fn dir() -> PathBuf {
    dir_with_source().0
}

/// Where clients look: $REKINDLE_RUNTIME_DIR alone if set, else
/// $XDG_RUNTIME_DIR/rekindle and /run/rekindle (a root shell may have
/// XDG_RUNTIME_DIR set while system services use /run/rekindle).
pub fn search_dirs() -> Vec<PathBuf> {
    let first = dir();
    let mut v = vec![first.clone()];
    let overridden = env_dir("REKINDLE_RUNTIME_DIR").is_some();
    let system = PathBuf::from("/run/rekindle");
    if !overridden && first != system {
        v.push(system);
    }
    v
}

/// What to do about a runtime directory we may not use: choose another one
/// with the variable it came from, or run as its owner.
pub fn hint(source: Source, owner: Option<u32>) -> String {
    let other = match source {
        Source::Rekindle => "set REKINDLE_RUNTIME_DIR to a directory of your own",
        Source::Xdg => "set XDG_RUNTIME_DIR (or REKINDLE_RUNTIME_DIR) to a directory of your own",
        Source::System => {
            "set XDG_RUNTIME_DIR (or REKINDLE_RUNTIME_DIR) to a directory of your own \
             (XDG_RUNTIME_DIR is usually /run/user/$(id -u))"
        }
    };
    let owner = match owner {
        Some(0) => "run as root".to_string(),
        Some(u) => format!("run as uid {u}"),
        None if source == Source::System => "run as root".to_string(),
        None => "run as the directory's owner".to_string(),
    };
    format!("{other}, or {owner}")
}

/// Why the runtime directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DirError {
    #[error("cannot create {dir}: {source}; {hint}")]
    Create {
        dir: PathBuf,
        source: std::io::Error,
        hint: String,
    },
    #[error("{dir}: {source}")]
    Stat {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("{0} is not a directory")]
    NotDir(PathBuf),
    #[error("{dir} belongs to uid {owner}, not to us (uid {me}): {hint}")]
    Owner {
        dir: PathBuf,
        owner: u32,
        me: u32,
        hint: String,
    },
    #[error("chmod 0700 {dir}: {source}")]
    Chmod {
        dir: PathBuf,
        source: std::io::Error,
    },
}

/// Creates the directory 0700 if needed; refuses one owned by someone else
/// (other than root for root) or open to others.  `source` says where the
/// path came from, for the hint of an error.
pub fn ensure(d: &Path, source: Source) -> Result<(), DirError> {
    if !d.exists() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(d)
            .map_err(|e| {
                let denied = matches!(
                    e.kind(),
                    std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem
                );
                DirError::Create {
                    dir: d.to_path_buf(),
                    hint: if denied {
                        hint(source, None)
                    } else {
                        "check the path".into()
                    },
                    source: e,
                }
            })?;
    }
    let md = fs::symlink_metadata(d).map_err(|e| DirError::Stat {
        dir: d.to_path_buf(),
        source: e,
    })?;
    if !md.is_dir() {
        return Err(DirError::NotDir(d.to_path_buf()));
    }
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    if md.uid() != me {
        return Err(DirError::Owner {
            dir: d.to_path_buf(),
            owner: md.uid(),
            me,
            hint: hint(source, Some(md.uid())),
        });
    }
    if md.mode() & 0o777 != 0o700 {
        fs::set_permissions(d, fs::Permissions::from_mode(0o700)).map_err(|e| DirError::Chmod {
            dir: d.to_path_buf(),
            source: e,
        })?;
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

    #[test]
    fn a_directory_of_someone_else_says_what_to_do() {
        let e = DirError::Owner {
            dir: "/run/rekindle".into(),
            owner: 0,
            me: 1000,
            hint: hint(Source::System, Some(0)),
        }
        .to_string();
        assert!(
            e.starts_with(
                "/run/rekindle belongs to uid 0, not to us (uid 1000): set XDG_RUNTIME_DIR"
            ),
            "{e}"
        );
        assert!(e.ends_with("or run as root"), "{e}");
        let h = hint(Source::Rekindle, Some(1001));
        assert_eq!(
            h,
            "set REKINDLE_RUNTIME_DIR to a directory of your own, or run as uid 1001"
        );
        assert!(hint(Source::System, None).ends_with("or run as root"));
    }
}
