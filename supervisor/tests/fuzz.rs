//! Property tests ("fuzzing" with proptest) of everything that parses input
//! from outside the supervisor: the app's binary messages, control-socket
//! requests, sd_notify datagrams, HTTP request lines, control blocks and
//! arena headers.  Random bytes never panic; valid messages round-trip; the
//! corpus in fuzz-corpus/ is replayed and mutated.

use std::path::PathBuf;

use proptest::prelude::*;
use rekindle::control_socket::{LineReader, RequestError, parse_request};
use rekindle::proto::{
    self, AppMsg, DECISION_LEN, FdEntry, FdKind, Hello, Inherit, NAME_LEN, REASON_LEN, Restarting,
    StartKind, SupMsg,
};
use rekindle::reason::Reason;

fn corpus(sub: &str) -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz-corpus")
        .join(sub);
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok())
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let data = std::fs::read(e.path()).unwrap_or_default();
            (name, data)
        })
        .collect();
    v.sort();
    assert!(!v.is_empty(), "empty corpus {}", dir.display());
    v
}

/// How many fds a corpus file of the app-msg kind travels with.
fn corpus_nfds(name: &str) -> usize {
    name.strip_prefix("fds")
        .and_then(|r| r.split('-').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[test]
fn app_message_corpus_replays() {
    for (name, data) in corpus("app-msg") {
        let r = proto::parse_app(&data, corpus_nfds(&name));
        if name.starts_with("valid-") || name.starts_with("fds") {
            let m = r.unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(proto::encode_app(&m), data, "{name}: re-encoding differs");
        } else if name.starts_with("invalid-") {
            assert!(r.is_err(), "{name} parsed: {r:?}");
        }
    }
}

#[test]
fn control_corpus_replays() {
    for (name, data) in corpus("control") {
        let r = parse_request(&data);
        if name.starts_with("valid-") {
            assert!(r.is_ok(), "{name}: {r:?}");
        } else if name.starts_with("invalid-") {
            assert!(r.is_err(), "{name} parsed: {r:?}");
        }
        // and through the line reader, as the server sees it
        let mut lr = LineReader::default();
        let mut out = Vec::new();
        let mut line = data.clone();
        line.push(b'\n');
        lr.push(&line, &mut out);
        assert!(out.len() <= 1, "{name}");
    }
}

// ---- strategies for valid messages ----------------------------------------------

fn text(max: usize) -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![
            Just('a'),
            Just('Z'),
            Just(' '),
            Just(':'),
            Just('é'),
            Just('✓')
        ],
        0..max,
    )
    .prop_map(move |v| {
        let s: String = v.into_iter().collect();
        let mut n = s.len().min(max);
        while !s.is_char_boundary(n) {
            n -= 1;
        }
        s[..n].to_string()
    })
}

fn start_kind() -> impl Strategy<Value = StartKind> {
    prop_oneof![
        Just(StartKind::Fresh),
        Just(StartKind::Warm),
        Just(StartKind::Cold)
    ]
}

fn fd_kind() -> impl Strategy<Value = FdKind> {
    prop_oneof![
        Just(FdKind::Manifest),
        Just(FdKind::Arena),
        Just(FdKind::Range)
    ]
}

fn app_msg() -> impl Strategy<Value = AppMsg> {
    prop_oneof![
        (any::<u32>(), any::<u32>()).prop_map(|(pid, caps)| AppMsg::Attach { pid, caps }),
        (
            any::<u32>(),
            any::<u32>(),
            start_kind(),
            any::<u32>(),
            any::<u64>(),
            any::<u64>(),
            text(REASON_LEN - 1),
            text(DECISION_LEN - 1)
        )
            .prop_map(
                |(
                    pid,
                    generation,
                    kind,
                    narenas,
                    restart_ns,
                    preserved_bytes,
                    reason,
                    decision,
                )| {
                    AppMsg::Hello(Hello {
                        pid,
                        generation,
                        kind,
                        narenas,
                        restart_ns,
                        preserved_bytes,
                        reason,
                        decision,
                        decision_code: any_reason(generation),
                    })
                }
            ),
        proptest::collection::vec((fd_kind(), text(NAME_LEN - 1)), 1..=proto::MAX_FDS).prop_map(
            |v| AppMsg::Fds(
                v.into_iter()
                    .map(|(kind, name)| FdEntry { kind, name })
                    .collect()
            )
        ),
        (
            any::<bool>(),
            0i32..=64,
            any::<u32>(),
            any::<u64>(),
            any::<u64>(),
            text(REASON_LEN - 1),
            text(DECISION_LEN - 1)
        )
            .prop_map(
                |(warm, signal, generation, t_ns, fault_addr, reason, decision)| {
                    AppMsg::Restarting(Restarting {
                        warm,
                        signal,
                        generation,
                        t_ns,
                        fault_addr,
                        reason,
                        decision,
                        decision_code: any_reason(generation),
                    })
                }
            ),
        any::<u64>().prop_map(|t_ns| AppMsg::Ready { t_ns }),
    ]
}

/// A decision code picked by another random field (keeps the tuples short).
fn any_reason(pick: u32) -> Reason {
    Reason::ALL[pick as usize % Reason::ALL.len()]
}

fn sup_msg() -> impl Strategy<Value = SupMsg> {
    prop_oneof![
        (
            start_kind(),
            any::<u32>(),
            any::<i32>(),
            any::<u64>(),
            text(REASON_LEN - 1),
            text(DECISION_LEN - 1),
            0u32..16
        )
            .prop_map(
                |(mode, generation, signal, t_detect_ns, reason, decision, dropped)| {
                    SupMsg::Inherit(Inherit {
                        mode,
                        generation,
                        signal,
                        t_detect_ns,
                        reason,
                        decision,
                        decision_code: any_reason(generation),
                        dropped,
                        flags: generation & 1,
                    })
                }
            ),
        text(255).prop_map(SupMsg::Error),
    ]
}

/// A seed from the corpus with random edits.
fn mutated_seed() -> impl Strategy<Value = (Vec<u8>, usize)> {
    let seeds = corpus("app-msg");
    (
        0..seeds.len(),
        proptest::collection::vec((any::<usize>(), any::<u8>()), 0..8),
        any::<Option<usize>>(),
        0usize..4,
    )
        .prop_map(move |(i, edits, cut, extra_fds)| {
            let (name, mut d) = seeds[i].clone();
            for (pos, b) in edits {
                if !d.is_empty() {
                    let p = pos % d.len();
                    d[p] = b;
                }
            }
            if let Some(c) = cut {
                let c = c % (d.len() + 1);
                d.truncate(c);
            }
            (d, corpus_nfds(&name) + extra_fds % 2)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic_the_codec(data in proptest::collection::vec(any::<u8>(), 0..5000), nfds in 0usize..40) {
        let _ = proto::parse_app(&data, nfds);
        let _ = proto::parse_sup(&data);
        let _ = proto::parse_header(&data);
    }

    #[test]
    fn random_bodies_behind_a_valid_header_never_panic(ty in 0u16..256, body in proptest::collection::vec(any::<u8>(), 0..1200), nfds in 0usize..40) {
        let mut d = Vec::new();
        d.extend_from_slice(&proto::MAGIC.to_le_bytes());
        d.extend_from_slice(&1u16.to_le_bytes());
        d.extend_from_slice(&ty.to_le_bytes());
        d.extend_from_slice(&(body.len() as u32).to_le_bytes());
        d.extend_from_slice(&0u32.to_le_bytes());
        d.extend_from_slice(&body);
        if let Ok(m) = proto::parse_app(&d, nfds) {
            // whatever parses re-encodes to something that parses the same
            prop_assert_eq!(proto::parse_app(&proto::encode_app(&m), m.nfds()), Ok(m));
        }
    }

    #[test]
    fn mutated_seeds_never_panic((data, nfds) in mutated_seed()) {
        if let Ok(m) = proto::parse_app(&data, nfds) {
            prop_assert_eq!(proto::parse_app(&proto::encode_app(&m), m.nfds()), Ok(m));
        }
    }

    #[test]
    fn valid_app_messages_round_trip(m in app_msg()) {
        let b = proto::encode_app(&m);
        prop_assert!(b.len() <= proto::MSG_MAX);
        prop_assert_eq!(proto::parse_app(&b, m.nfds()), Ok(m.clone()));
        // with the wrong number of fds it is refused, never misread
        prop_assert!(proto::parse_app(&b, m.nfds() + 1).is_err());
        // any truncation is refused
        for cut in [0, 1, 15, 16, b.len() - 1] {
            prop_assert!(proto::parse_app(&b[..cut.min(b.len() - 1)], m.nfds()).is_err());
        }
    }

    #[test]
    fn valid_supervisor_messages_round_trip(m in sup_msg()) {
        let b = proto::encode_sup(&m);
        prop_assert_eq!(proto::parse_sup(&b), Ok(m));
    }

    #[test]
    fn random_control_lines_never_panic(data in proptest::collection::vec(any::<u8>(), 0..2000)) {
        let _ = parse_request(&data);
    }

    #[test]
    fn jsonish_control_lines_never_panic(s in "[{}\\[\\]\",:a-z0-9 \\\\]{0,200}") {
        let _ = parse_request(s.as_bytes());
    }

    #[test]
    fn cmd_objects_are_judged_by_cmd(cmd in "[a-z-]{0,12}", mode in proptest::option::of("[a-z]{0,6}")) {
        let mut v = serde_json::json!({"cmd": cmd});
        if let Some(m) = &mode {
            v["mode"] = serde_json::Value::from(m.as_str());
        }
        let r = parse_request(v.to_string().as_bytes());
        match cmd.as_str() {
            "status" | "stop" | "inspect" => prop_assert!(r.is_ok()),
            "restart" => prop_assert_eq!(
                r.is_ok(),
                mode.as_deref().is_none_or(|m| m == "warm" || m == "cold")
            ),
            _ => prop_assert!(matches!(r, Err(RequestError::UnknownCmd(_)))),
        }
    }

    #[test]
    fn line_reader_does_not_depend_on_chunking(
        lines in proptest::collection::vec(prop_oneof![
            Just(b"{\"cmd\":\"status\"}".to_vec()),
            Just(b"junk".to_vec()),
            Just(vec![b'x'; 70000]),
            proptest::collection::vec(any::<u8>().prop_filter("no newline", |c| *c != b'\n'), 0..100),
        ], 0..6),
        cuts in proptest::collection::vec(any::<usize>(), 0..10),
    ) {
        let mut stream = Vec::new();
        for l in &lines {
            stream.extend_from_slice(l);
            stream.push(b'\n');
        }
        let mut whole = Vec::new();
        LineReader::default().push(&stream, &mut whole);
        let mut pos: Vec<usize> = cuts.iter().map(|c| c % (stream.len() + 1)).collect();
        pos.sort();
        let mut chunked = Vec::new();
        let mut lr = LineReader::default();
        let mut last = 0;
        for p in pos.into_iter().chain([stream.len()]) {
            lr.push(&stream[last..p], &mut chunked);
            last = p;
        }
        prop_assert_eq!(whole, chunked);
    }

    #[test]
    fn notify_and_http_parsers_never_panic(data in proptest::collection::vec(any::<u8>(), 0..3000)) {
        let _ = rekindle::notify::parse_notify(&data);
        let _ = rekindle::metrics::respond(&data, &|| String::new());
        let _ = rekindle::arena::check_header_bytes(&data);
        if let Ok(s) = std::str::from_utf8(&data) {
            let _ = rekindle::notify::parse_fdname(s);
            let _ = rekindle::procfs::parse_rss_anon(s);
        }
    }

    #[test]
    fn random_control_blocks_never_panic(
        slots in proptest::collection::vec((0usize..256, any::<u32>(), 0usize..16, any::<u16>()), 0..8),
        narenas in any::<u32>(),
        names in proptest::collection::vec(any::<u8>(), 0..800),
    ) {
        use rekindle::control_block::*;
        let mut b = vec![0u8; SIZE];
        b[OFF_NARENAS..OFF_NARENAS + 4].copy_from_slice(&narenas.to_le_bytes());
        let n = names.len().min(MAX_ARENAS * ARENA_NAME_LEN);
        b[OFF_ARENA_NAMES..OFF_ARENA_NAMES + n].copy_from_slice(&names[..n]);
        for (i, tid, k, depth) in &slots {
            let s = OFF_SLOTS + i * SLOT_SIZE;
            b[s..s + 4].copy_from_slice(&tid.to_le_bytes());
            b[s + 4 + 2 * k..s + 6 + 2 * k].copy_from_slice(&depth.to_le_bytes());
        }
        let r = b.as_slice().open_region();
        let expect_open = slots.iter().any(|(i, tid, k, depth)| {
            *tid != 0 && *depth != 0 && {
                // a later write to the same slot may have changed it: re-read
                let s = OFF_SLOTS + i * SLOT_SIZE;
                b.as_slice().load_u32(s) != 0 && b.as_slice().load_u16(s + 4 + 2 * k) != 0
            }
        });
        prop_assert_eq!(r.is_some(), expect_open);
        if let Some(r) = r {
            prop_assert!(r.describe().starts_with("unsafe region open in arena "));
        }
    }
}
