//! `rekindle inspect`'s reader on an arena the runtime made: a C program
//! (tests/inspect/real_arena.c, compiled with runtime/src/*.c) allocates a
//! known set of objects and waits; the test opens the arena memfd through
//! /proc/PID/fd, as a second holder of the same file, and reads it.

use std::io::{BufRead, BufReader};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use rekindle::inspect::{self, FdSource, Target};

fn build_app() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = std::env::temp_dir().join(format!("rekindle-inspect-real-{}", std::process::id()));
    let mut srcs: Vec<PathBuf> = std::fs::read_dir(root.join("runtime/src"))
        .unwrap_or_else(|e| panic!("runtime/src: {e}"))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "c"))
        .collect();
    srcs.push(root.join("supervisor/tests/inspect/real_arena.c"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-std=c11", "-O1", "-D_GNU_SOURCE", "-pthread", "-I"])
        .arg(root.join("runtime/include"))
        .arg("-I")
        .arg(root.join("runtime/src"))
        .args(&srcs)
        .arg("-o")
        .arg(&out)
        .status()
        .unwrap_or_else(|e| panic!("running {cc}: {e}"));
    assert!(status.success(), "compiling real_arena.c failed");
    out
}

#[test]
fn an_arena_the_runtime_made_is_read_exactly() {
    let exe = build_app();
    let mut child = Command::new(&exe)
        .env_remove("REKINDLE_SUPERVISOR_FD")
        .env_remove("REKINDLE_CONTROL_FD")
        .env_remove("REKINDLE_MANIFEST_FD")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped()) // the runtime's event lines
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    let _ = std::fs::remove_file(&exe);
    let mut line = String::new();
    let stdout = child.stdout.take().unwrap_or_else(|| panic!("no stdout"));
    BufReader::new(stdout)
        .read_line(&mut line)
        .unwrap_or_else(|e| panic!("{e}"));
    let f: Vec<u64> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    if f.len() != 4 {
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        panic!("real_arena printed {line:?}; stderr: {err}");
    }
    let (pid, fd, allocated, base) = (f[0], f[1], f[2], f[3]);
    let file = std::fs::File::open(format!("/proc/{pid}/fd/{fd}"))
        .unwrap_or_else(|e| panic!("opening the arena memfd: {e}"));
    let src = FdSource::open(file.as_fd()).unwrap_or_else(|e| panic!("{e}"));
    let r = inspect::inspect_arena("real", &src, Duration::from_secs(10));
    drop(child.stdin.take()); // the app exits
    let _ = child.wait();

    assert!(r.exact, "{:#?}", r.problems);
    assert!(r.header_ok && r.layout_ok && r.roots_ok && r.walk.complete);
    assert_eq!(r.base, base);
    assert_eq!(r.max_bytes, 64 << 20);
    assert_eq!(r.allocated_bytes, allocated, "rk_arena_stats");
    assert_eq!(allocated, 50 * 32 + 10 * 1024 + 2 * 25 * 4096);
    assert_eq!(r.counted_bytes, allocated);
    let class = |size: u32| {
        r.classes
            .iter()
            .find(|c| c.size == size)
            .map(|c| (c.slabs, c.objects))
    };
    assert_eq!(class(32), Some((1, 50)));
    assert_eq!(class(1024), Some((1, 10)));
    assert_eq!(r.classes.len(), 2);
    assert_eq!((r.large.objects, r.large.bytes), (2, 2 * 25 * 4096));
    // big[1], freed between big[0] and big[2]
    assert_eq!((r.free_runs.count, r.free_runs.bytes), (1, 25 * 4096));
    assert_eq!(r.objects, 62);
    let root = |name: &str| {
        r.roots
            .iter()
            .find(|x| x.name == name)
            .unwrap_or_else(|| panic!("no root {name}: {:?}", r.roots))
    };
    assert_eq!(
        root("first").target,
        Some(Target {
            kind: "slab",
            size: 32
        })
    );
    assert_eq!(
        root("big").target,
        Some(Target {
            kind: "large",
            size: 25 * 4096
        })
    );
    assert!(root("big").in_arena && root("big").in_heap);
    assert!(r.locks_held.is_empty());
}
