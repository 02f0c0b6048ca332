//! The default suppressions must never hide the program's own blocks, whatever
//! `--num-callers` truncates their patterns to (Valgrind truncates them the same way).

use oxgrind_formats::suppressions::{parse, ErrorClass, LeakKind, SuppFrame};

fn frame(fun: &str, obj: &str) -> SuppFrame {
    SuppFrame {
        fun: Some(fun.into()),
        obj: Some(obj.into()),
        file: None,
        line: 0,
    }
}

#[test]
fn default_suppressions_never_match_a_programs_own_block() {
    let programs_block = [
        frame("malloc", "/usr/local/lib/liboxgrind_runtime.so"),
        frame("keep_reachable", "/home/u/prog"),
        frame("main", "/home/u/prog"),
    ];
    for num_callers in 1..=12 {
        // As Memcheck loads them: never cut (see Memcheck::load_suppressions).
        let supps = parse(
            "default.supp",
            oxgrind_memcheck::DEFAULT_SUPPRESSIONS,
            "Memcheck",
            usize::MAX,
        )
        .unwrap();
        for kind in [
            LeakKind::Reachable,
            LeakKind::Possible,
            LeakKind::Definite,
            LeakKind::Indirect,
        ] {
            let stack = &programs_block[..num_callers.min(programs_block.len())];
            for s in &supps {
                assert!(
                    !s.matches(&ErrorClass::Leak(kind), stack),
                    "--num-callers={num_callers}: default suppression {} hides a program block",
                    s.name
                );
            }
        }
    }
}
