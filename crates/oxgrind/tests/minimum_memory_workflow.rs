//! docs/minimum-memory.md, run as a new user would run it (issue 11): every `$ ` command of
//! its Massif steps (heap peak, stacks, pages), on the input it names, must succeed with our
//! `oxgrind` first on the PATH; a number the page prints as a command's whole output must be
//! the one we print; and the three peaks must stand as the page explains them (the pages
//! peak holds the heap peak; the stack is small for xz).

mod common;
use common::*;

use std::process::Command;

/// The `$ ` commands of the page's steps 1-3 (up to "## 4", leaving out the `prlimit`
/// checks of the native program), each with the output the page shows under it.
fn documented_commands(page: &str) -> Vec<(String, Vec<String>)> {
    let steps = &page[..page.find("\n## 4").expect("the page has a step 4")];
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    let mut in_block = false;
    for line in steps.lines() {
        if line.starts_with("```") {
            in_block = !in_block;
            continue;
        }
        if !in_block {
            continue;
        }
        if let Some(cmd) = line.strip_prefix("$ ") {
            out.push((cmd.to_string(), Vec::new()));
        } else if let Some((_, shown)) = out.last_mut() {
            shown.push(line.to_string());
        }
    }
    out.retain(|(cmd, _)| !cmd.starts_with("prlimit"));
    out
}

fn field_max(text: &str, name: &str) -> u64 {
    text.lines()
        .filter_map(|l| l.strip_prefix(name)?.parse::<u64>().ok())
        .max()
        .unwrap_or(0)
}

#[test]
fn the_minimum_memory_page_runs_as_written() {
    let page = std::fs::read_to_string(repo_root().join("docs/minimum-memory.md")).unwrap();
    let commands = documented_commands(&page);
    assert!(
        commands.len() >= 6,
        "the page's steps lost their commands: {commands:?}"
    );
    for needed in ["--stacks=yes", "--pages-as-heap=yes", "ms_print"] {
        assert!(
            commands.iter().any(|(c, _)| c.contains(needed)),
            "no step runs {needed}"
        );
    }
    // The input the page names: `seq 1 150000 > input.txt`.
    assert!(page.contains("seq 1 150000 > input.txt"));
    let dir = tempfile::tempdir().unwrap();
    let input: String = (1..=150000).map(|i| format!("{i}\n")).collect();
    std::fs::write(dir.path().join("input.txt"), input).unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(oxgrind(), bin.join("oxgrind")).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for (cmd, shown) in &commands {
        // A pager has no terminal here.
        let cmd = cmd.replace("| less", "| cat");
        let o = run(Command::new("/bin/sh")
            .args(["-c", &cmd])
            .current_dir(dir.path())
            .env("PATH", &path)
            .env(
                "GLIBC_TUNABLES",
                "glibc.cpu.hwcaps=-AVX512F,-AVX512VL,-AVX512BW",
            ));
        assert!(o.status.success(), "`{cmd}` failed: {}", stderr(&o));
        let printed = stdout(&o);
        if cmd.contains("> /dev/null") {
            continue;
        }
        assert!(!printed.trim().is_empty(), "`{cmd}` printed nothing");
        if let [number] = shown.as_slice() {
            if number.chars().all(|c| c.is_ascii_digit()) {
                assert_eq!(printed.trim(), number, "`{cmd}` prints another number");
            }
        }
    }
    let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap();
    let (heap, stacks, pages) = (read("xz.heap"), read("xz.stacks"), read("xz.pages"));
    let heap_peak = massif_peak(&heap).expect("a heap peak");
    let pages_peak = massif_peak(&pages).expect("a pages peak");
    assert!(heap_peak > 90_000_000, "xz -6 keeps ~97 MB: {heap_peak}");
    assert!(
        pages_peak >= heap_peak,
        "every heap byte is on a mapped page: pages {pages_peak} < heap {heap_peak}"
    );
    let stack_peak = field_max(&stacks, "mem_stacks_B=");
    assert!(
        stack_peak > 0 && stack_peak < 1 << 20,
        "xz's stack: {stack_peak}"
    );
}
