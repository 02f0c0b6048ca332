//! The floor plan holds (docs/architecture.md): tools see only the contract, the contract
//! sees no engine, and the launcher links no decoder. Checked on the dependency graph
//! Cargo itself resolves (`cargo tree`), so a new `[dependencies]` line that breaks a rule
//! fails here, not in review.

use std::collections::BTreeSet;
use std::process::Command;

/// The crates `package` depends on for its build (normal edges, transitively).
fn normal_dependencies(package: &str) -> BTreeSet<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "tree",
            "--offline",
            "-e",
            "normal",
            "--prefix",
            "none",
            "-p",
            package,
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree -p {package}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .skip(1) // the package itself
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

const CORE: [&str; 4] = [
    "oxgrind-runtime",
    "oxgrind-engine",
    "oxgrind-sys",
    "oxgrind-symbols",
];

#[test]
fn the_contract_depends_on_no_core_crate() {
    let deps = normal_dependencies("oxgrind-tool");
    for c in CORE.iter().chain(&["iced-x86"]) {
        assert!(!deps.contains(*c), "oxgrind-tool depends on {c}: {deps:?}");
    }
}

/// Every tool crate: the packages under `tools/`.
fn tool_crates() -> Vec<String> {
    let tools = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools");
    let mut names: Vec<String> = std::fs::read_dir(&tools)
        .expect("tools/")
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("Cargo.toml")).ok())
        .filter_map(|toml| {
            let line = toml.lines().find(|l| l.trim_start().starts_with("name"))?;
            Some(line.split('"').nth(1)?.to_string())
        })
        .collect();
    names.sort();
    assert!(names.len() >= 4, "tool crates: {names:?}");
    names
}

#[test]
fn tools_see_only_the_contract_and_the_formats() {
    for tool in tool_crates() {
        let deps = normal_dependencies(&tool);
        assert!(deps.contains("oxgrind-tool"), "{tool}: {deps:?}");
        for c in CORE.iter().chain(&["iced-x86"]) {
            assert!(!deps.contains(*c), "{tool} depends on {c}: {deps:?}");
        }
    }
}

#[test]
fn the_launcher_links_neither_the_engine_nor_the_decoder() {
    let deps = normal_dependencies("oxgrind");
    for c in ["oxgrind-engine", "oxgrind-runtime", "iced-x86"] {
        assert!(!deps.contains(c), "the launcher depends on {c}: {deps:?}");
    }
}

#[test]
fn the_engine_implements_the_contract() {
    let deps = normal_dependencies("oxgrind-engine");
    assert!(deps.contains("oxgrind-tool"), "{deps:?}");
    assert!(!deps.contains("oxgrind-runtime"), "{deps:?}");
}
