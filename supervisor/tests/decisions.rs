//! The warm/cold cases both deciders must agree on (tests/contract/
//! decisions.tsv; the runtime runs the same table in runtime/tests/
//! test_decide.c): same mode, same reason code, same arenas dropped.

use std::path::PathBuf;
use std::time::Duration;

use rekindle::decide::{ArenaFacts, Facts, Mode, decide};
use rekindle::reason::Reason;

fn list(s: &str) -> Vec<String> {
    if s == "-" {
        Vec::new()
    } else {
        s.split(',').map(str::to_string).collect()
    }
}

#[test]
fn the_shared_decision_table() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/contract/decisions.tsv");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut cases = 0;
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let c: Vec<&str> = line.split('\t').collect();
        assert_eq!(c.len(), 11, "a case with {} columns: {line}", c.len());
        let unsafe_in = list(c[7]);
        let arenas = list(c[1])
            .into_iter()
            .map(|a| {
                let name = a.trim_end_matches('*').to_string();
                ArenaFacts {
                    independent: a.ends_with('*'),
                    unsafe_open: unsafe_in
                        .contains(&name)
                        .then(|| format!("unsafe region open in arena {name} (tid 1)")),
                    ..ArenaFacts::ok(&name)
                }
            })
            .collect();
        let warm_start = c[4] != "-";
        let ms = |s: &str| Duration::from_millis(s.parse().unwrap_or(0));
        let f = Facts {
            has_manifest: true,
            control_damage: (c[3] == "yes").then(|| "control block corrupt: bad magic".into()),
            warm_disabled: c[6] == "yes",
            last_start_warm: warm_start,
            uptime: if warm_start {
                ms(c[4])
            } else {
                Duration::from_secs(3600)
            },
            crashloop_window: ms(c[5]),
            arenas,
            cold_requested: c[2] == "yes",
            ..Facts::default()
        };
        let d = decide(&f);
        let want_mode = if c[8] == "warm" {
            Mode::Warm
        } else {
            Mode::Cold
        };
        assert_eq!(d.mode, want_mode, "{}: {d:?}", c[0]);
        assert_eq!(Some(d.code), Reason::from_name(c[9]), "{}: {d:?}", c[0]);
        assert_eq!(d.dropped, list(c[10]), "{}: {d:?}", c[0]);
        cases += 1;
    }
    assert!(cases >= 10, "only {cases} cases in {}", path.display());
}
