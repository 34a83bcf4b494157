//! The safe API against the real runtime, in one process that restarts
//! itself (so no test harness: `rekindle::init` wants to be alone, first
//! thing in `main`, and a restart re-executes this binary from `main`).
//!
//! - generation 0 (fresh): init, arenas, alloc, views and regions, typed
//!   roots and their refusals, PVec; then `restart`;
//! - generation 1 (warm): everything is back; marks and a sweep free an
//!   object nobody marked; then a panic unwinds through a region, which
//!   vetoes warm restarts, and `restart` goes cold;
//! - generation 2 (cold): the arena is empty again.
//!
//! Prints one line per check and a closing "N passed, N failed" line.
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::ExitCode;

use rekindle::{Arena, ArenaFlags, Error, PVec, Preservable, Preserved, StartKind};

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
struct Point {
    x: i64,
    y: i64,
}
// SAFETY: repr(C) plain data.
unsafe impl Preservable for Point {}

/// Same size and alignment as Point, another type.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
struct Pair {
    a: u64,
    b: u64,
}
// SAFETY: repr(C) plain data.
unsafe impl Preservable for Pair {}

#[repr(C)]
struct Doc {
    origin: Preserved<Point>,
    path: PVec<Point>,
    note: Option<Preserved<Pair>>,
}
// SAFETY: repr(C); its handles point into the same arena.
unsafe impl Preservable for Doc {}

/// Runs `f`, catching a panic without printing it.
fn catch_quietly<R>(f: impl FnOnce() -> R) -> Result<R, ()> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = catch_unwind(AssertUnwindSafe(f)).map_err(|_| ());
    std::panic::set_hook(hook);
    r
}

struct Checks {
    generation: u32,
    passed: u32,
    failed: u32,
}

impl Checks {
    fn check(&mut self, name: &str, ok: bool, detail: impl std::fmt::Debug) {
        if ok {
            self.passed += 1;
            println!("test gen{}::{name} ... ok", self.generation);
        } else {
            self.failed += 1;
            println!("test gen{}::{name} ... FAILED: {detail:?}", self.generation);
        }
    }
}

fn main() -> ExitCode {
    // The restarts below come quickly, on purpose: no crash-loop window.
    // SAFETY: no other thread runs yet.
    unsafe { std::env::set_var("REKINDLE_CRASHLOOP_MS", "0") };

    // before init: refused, not undefined
    let early = Arena::open("early", 1 << 20);

    let mut start = match rekindle::init() {
        Ok(s) => s,
        Err(e) => {
            println!("rekindle::init failed: {e}");
            println!("0 passed, 1 failed");
            return ExitCode::FAILURE;
        }
    };
    let mut c = Checks {
        generation: start.generation,
        passed: 0,
        failed: 0,
    };
    if start.generation == 0 {
        c.check(
            "open_before_init_is_refused",
            matches!(early, Err(Error::NotInitialized(_))),
            &early,
        );
    }
    let again = rekindle::init();
    c.check(
        "second_init_is_refused",
        matches!(again, Err(Error::AlreadyInitialized)),
        &again,
    );
    let arena = match Arena::open("api", 64 << 20) {
        Ok(a) => a,
        Err(e) => {
            println!("Arena::open failed: {e}");
            println!("{} passed, {} failed", c.passed, c.failed + 1);
            return ExitCode::FAILURE;
        }
    };
    match start.generation {
        0 => fresh(&mut c, &start, arena),
        1 => warm(&mut c, &mut start, arena),
        _ => cold(&mut c, &start, arena),
    }
    // generations 0 and 1 restart from inside fresh()/warm() on success
    let (passed, failed) = totals(&c, true);
    println!("{passed} passed, {failed} failed");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The counts of every generation so far, this one's included. Earlier
/// generations leave theirs in a file named after the pid (an in-place
/// restart keeps it); `last` removes the file.
fn totals(c: &Checks, last: bool) -> (u32, u32) {
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("api-checks-{}", std::process::id()));
    let before = if c.generation == 0 {
        String::new()
    } else {
        std::fs::read_to_string(&path).unwrap_or_default()
    };
    let mut n = before
        .split_whitespace()
        .map(|w| w.parse::<u32>().unwrap_or(0));
    let passed = n.next().unwrap_or(0) + c.passed;
    let failed = n.next().unwrap_or(0) + c.failed;
    if last {
        let _ = std::fs::remove_file(&path);
    } else if let Err(e) = std::fs::write(&path, format!("{passed} {failed}")) {
        println!("cannot keep the counts in {}: {e}", path.display());
    }
    (passed, failed)
}

fn fresh(c: &mut Checks, start: &rekindle::Start, arena: Arena) {
    c.check(
        "fresh_start",
        start.kind == StartKind::Fresh && start.recovery.is_none(),
        start,
    );
    // not under `rekindle run --snapshot-dir`: the durability calls say so
    let cp = rekindle::checkpoint();
    c.check(
        "no_snapshots_no_durability",
        rekindle::epoch() == 0
            && rekindle::durable_epoch() == 0
            && rekindle::durable_fd().is_none()
            && cp.as_ref().err().and_then(Error::raw_os_error) == Some(95), // ENOTSUP on Linux
        &cp,
    );
    c.check("not_restored", start.snapshot.is_none(), start);
    c.check("new_arena_is_not_preserved", !arena.preserved(), arena);
    let same = Arena::open("api", 64 << 20);
    c.check(
        "reopen_returns_the_same_arena",
        same.as_ref().is_ok_and(|a| a.as_raw() == arena.as_raw()),
        &same,
    );
    for bad in ["", "has space", "x".repeat(48).as_str(), "nul\0"] {
        let r = Arena::open(bad, 1 << 20);
        c.check(
            "bad_arena_name_is_refused",
            matches!(r, Err(Error::InvalidName { .. })),
            (bad, &r),
        );
    }

    // alloc, read, change
    let origin = arena.alloc(Point { x: 1, y: 2 }).expect("alloc");
    c.check("handle_is_8_bytes", size_of::<Preserved<Point>>() == 8, ());
    c.check("alloc_lands_in_the_arena", arena.contains(origin), origin);
    c.check(
        "view_reads",
        *arena.view().get(origin) == Point { x: 1, y: 2 },
        (),
    );
    arena.modify(|g| g.get_mut(origin).x = 10);
    c.check("region_writes", arena.view().get(origin).x == 10, ());

    // PVec growth and removal
    let doc = arena
        .alloc(Doc {
            origin,
            path: PVec::new(),
            note: None,
        })
        .expect("alloc doc");
    let pushed = arena.modify(|g| -> rekindle::Result<()> {
        let d = g.get_mut(doc);
        for i in 0..1000 {
            d.path.push(arena, Point { x: i, y: -i })?;
        }
        let last = d.path.pop();
        let removed = d.path.swap_remove(0);
        if last != Some(Point { x: 999, y: -999 }) || removed != (Point { x: 0, y: 0 }) {
            return Err(Error::SizeOverflow);
        }
        Ok(())
    });
    let len = arena.view().get(doc).path.len();
    c.check(
        "pvec_grows_pops_and_removes",
        pushed.is_ok() && len == 998,
        (&pushed, len),
    );
    let note = arena.alloc(Pair { a: 7, b: 8 }).expect("alloc note");
    arena.modify(|g| g.get_mut(doc).note = Some(note));

    // a PVec stored in one arena does not grow into another
    let other = Arena::open("api-other", 16 << 20).expect("open a second arena");
    let foreign = arena.modify(|g| g.get_mut(doc).path.push(other, Point { x: 0, y: 0 }));
    c.check(
        "pvec_refuses_another_arena",
        matches!(foreign, Err(Error::ForeignHandle(..))),
        &foreign,
    );
    let moved = other.alloc(PVec::<u64>::new()).and_then(|home| {
        let mut v = PVec::new();
        v.push(arena, 1u64)?; // built on the stack, its buffer in `arena`
        other.modify(|g| *g.get_mut(home) = v); // moved into `other`
        Ok(catch_quietly(|| other.view().get(home).as_slice().len()))
    });
    c.check(
        "pvec_moved_between_arenas_is_caught",
        matches!(moved, Ok(Err(_))),
        &moved,
    );
    let bad_root = arena.set_root("elsewhere", other.alloc(1u64).expect("alloc"));
    c.check(
        "root_refuses_a_handle_of_another_arena",
        matches!(bad_root, Err(Error::ForeignHandle(..))),
        &bad_root,
    );
    let wrong_view = catch_quietly(|| *other.view().get(origin));
    c.check("view_of_another_arena_panics", wrong_view.is_err(), ());

    // typed roots
    let set = arena
        .set_root("doc", doc)
        .and(arena.set_root("origin", origin));
    c.check("set_root", set.is_ok(), &set);
    let back = arena.root::<Doc>("doc");
    c.check(
        "root_reads_back",
        matches!(back, Ok(Some(p)) if p == doc),
        &back,
    );
    let as_pair = arena.root::<Pair>("origin");
    c.check(
        "root_of_another_type_is_refused",
        matches!(&as_pair, Err(Error::RootType { name, .. }) if name == "origin"),
        &as_pair,
    );
    let as_u8 = arena.root::<u8>("doc");
    c.check(
        "root_of_another_size_is_refused",
        matches!(as_u8, Err(Error::RootType { .. })),
        &as_u8,
    );
    let missing = arena.root::<Doc>("nope");
    c.check(
        "missing_root_is_none",
        matches!(missing, Ok(None)),
        &missing,
    );
    let reserved = arena.set_root("rekindle-rs.types", origin);
    c.check(
        "reserved_root_name_is_refused",
        matches!(reserved, Err(Error::InvalidName { .. })),
        &reserved,
    );
    let long = arena.root::<Doc>(&"r".repeat(48));
    c.check(
        "long_root_name_is_refused",
        matches!(long, Err(Error::InvalidName { .. })),
        &long,
    );
    // a root set by C code carries no type record
    // SAFETY: origin is an object of this arena; the name is NUL-terminated.
    let raw = unsafe {
        rekindle::ffi::rk_root_set(arena.as_raw(), c"from-c".as_ptr(), origin.as_ptr().cast())
    };
    let untyped = arena.root::<Point>("from-c");
    c.check(
        "untyped_root_is_refused",
        raw == 0 && matches!(untyped, Err(Error::UntypedRoot(_))),
        (raw, &untyped),
    );
    let tmp = arena.alloc(5u32).expect("alloc");
    let removed = arena
        .set_root("tmp", tmp)
        .and_then(|_| arena.remove_root("tmp"))
        .and_then(|_| arena.root::<u32>("tmp"));
    c.check("remove_root", matches!(removed, Ok(None)), &removed);

    // in flight at the restart: allocated, reachable from nothing
    let garbage = arena.alloc([0u8; 4000]).expect("alloc garbage");
    arena
        .set_root(
            "garbage-addr",
            arena.alloc(garbage.addr() as u64).expect("alloc"),
        )
        .expect("root");

    let st = arena.stats().expect("stats");
    c.check(
        "stats",
        st.allocated_bytes > 16_000 && st.max_bytes >= 64 << 20,
        st,
    );
    let wp = Arena::open_with(
        "api-wp",
        4 << 20,
        ArenaFlags::INDEPENDENT | ArenaFlags::WRITE_PROTECT,
    );
    c.check("open_with_flags", wp.is_ok(), &wp);

    if c.failed == 0 {
        println!("gen0: restarting warm");
        totals(c, false);
        let e = rekindle::restart("api test: warm");
        c.check("restart_returns_only_on_failure", false, e);
    }
}

fn warm(c: &mut Checks, start: &mut rekindle::Start, arena: Arena) {
    c.check(
        "warm_start",
        start.kind == StartKind::Warm && start.recovery.is_some() && rekindle::is_recovery(),
        &*start,
    );
    c.check(
        "reason_is_ours",
        start.reason.contains("api test: warm"),
        &start.reason,
    );
    c.check("arena_is_preserved", arena.preserved(), arena);
    let doc = arena.root::<Doc>("doc");
    let Ok(Some(doc)) = doc else {
        c.check("doc_root_survives", false, &doc);
        return;
    };
    let ok = arena.read(|v| {
        let d = v.get(doc);
        *v.get(d.origin) == Point { x: 10, y: 2 }
            && d.path.len() == 998
            && d.path[0] == Point { x: 998, y: -998 }
            && d.path[997]
                == Point {
                    x: 998 - 1,
                    y: -(998 - 1),
                }
            && d.note.is_some_and(|n| *v.get(n) == Pair { a: 7, b: 8 })
    });
    c.check("objects_survive", ok, ());
    let wrong = arena.root::<Pair>("origin");
    c.check(
        "root_type_check_survives",
        matches!(wrong, Err(Error::RootType { .. })),
        &wrong,
    );

    // mark what the app reaches; the sweep frees the rest
    let Some(mut rec) = start.recovery.take() else {
        return;
    };
    let marked = arena.read(|v| -> rekindle::Result<()> {
        let d = v.get(doc);
        rec.mark(arena, doc)?;
        rec.mark(arena, d.origin)?;
        d.path.mark(&rec, arena)?;
        if let Some(n) = d.note {
            rec.mark(arena, n)?;
        }
        Ok(())
    });
    c.check("marks", marked.is_ok(), &marked);
    let garbage_addr = arena
        .root::<u64>("garbage-addr")
        .ok()
        .flatten()
        .map(|p| *arena.view().get(p));
    // SAFETY: after the sweep this test uses only doc and what it reaches
    // (all marked) and the typed roots (marked by the sweep itself).
    let swept = unsafe { rec.sweep() };
    c.check(
        "sweep_frees_the_unmarked",
        swept
            .as_ref()
            .is_ok_and(|s| s.objects_freed >= 1 && s.bytes_freed >= 4000),
        &swept,
    );
    c.check("recovery_is_over", !rekindle::is_recovery(), ());
    let mark_late = rec.mark(arena, doc);
    c.check(
        "mark_after_recovery_is_refused",
        mark_late.is_err(),
        &mark_late,
    );
    // the swept block's memory is free again: a same-size alloc may reuse it
    c.check("garbage_was_recorded", garbage_addr.is_some(), garbage_addr);
    let ready = rekindle::ready();
    c.check("ready", ready.is_ok(), &ready);

    // a panic unwinding through a region: warm restarts are vetoed
    let quiet = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let unwound = catch_unwind(AssertUnwindSafe(|| {
        arena.modify(|g| {
            g.get_mut(doc).path.truncate(1);
            panic!("half-done change");
        })
    }));
    std::panic::set_hook(quiet);
    c.check("region_panic_unwinds", unwound.is_err(), ());
    // the lock is usable again
    let len = arena.view().get(doc).path.len();
    c.check("arena_usable_after_unwinding", len == 1, len);

    // one thread mixing views and regions of an arena: nested views share
    // the lock; the rest panics instead of aliasing or waiting for itself
    // (the next restart is cold anyway: these unwind through regions)
    let nested = arena.read(|v1| arena.read(|v2| v1.get(doc).path.len() + v2.get(doc).path.len()));
    c.check("nested_views", nested == 2, nested);
    std::panic::set_hook(Box::new(|_| {}));
    let view_in_region = catch_unwind(AssertUnwindSafe(|| arena.modify(|_g| drop(arena.view()))));
    let region_in_region = catch_unwind(AssertUnwindSafe(|| {
        arena.modify(|_g| drop(arena.unsafe_region()))
    }));
    let region_in_view = catch_unwind(AssertUnwindSafe(|| {
        arena.read(|_v| drop(arena.unsafe_region()))
    }));
    drop(std::panic::take_hook()); // the default hook again
    c.check(
        "same_thread_misuse_panics",
        view_in_region.is_err() && region_in_region.is_err() && region_in_view.is_err(),
        (
            view_in_region.is_err(),
            region_in_region.is_err(),
            region_in_view.is_err(),
        ),
    );
    // and leaves the arena usable, from another thread too
    let other_thread = std::thread::spawn(move || {
        arena.modify(|g| g.get_mut(doc).path.truncate(0));
        arena.view().get(doc).path.len()
    })
    .join();
    c.check(
        "usable_from_another_thread",
        matches!(other_thread, Ok(0)),
        &other_thread,
    );
    if c.failed == 0 {
        println!("gen1: restarting after the veto (must be cold)");
        totals(c, false);
        let e = rekindle::restart("api test: after a panic in a region");
        c.check("restart_returns_only_on_failure", false, e);
    }
}

fn cold(c: &mut Checks, start: &rekindle::Start, arena: Arena) {
    c.check(
        "vetoed_restart_is_cold",
        start.kind == StartKind::Cold && start.decision.contains("disabled by the app"),
        start,
    );
    c.check("cold_arena_is_empty", !arena.preserved(), arena);
    let doc = arena.root::<Doc>("doc");
    c.check("no_roots_after_cold", matches!(doc, Ok(None)), &doc);
}
