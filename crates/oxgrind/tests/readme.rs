//! The README tells a new user what to install before its two commands (issue 11, Build
//! item 6): a Rust toolchain of at least the workspace's `rust-version`, stated before the
//! first command of "Two commands on a fresh Debian 12 machine", with the version the
//! workspace really asks for.

mod common;
use common::*;

#[test]
fn the_prerequisites_come_before_the_two_commands_with_the_workspaces_rust_version() {
    let root = repo_root();
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let version = manifest
        .lines()
        .find_map(|l| {
            let v = l.trim().strip_prefix("rust-version")?;
            Some(
                v.trim()
                    .trim_start_matches('=')
                    .trim()
                    .trim_matches('"')
                    .to_string(),
            )
        })
        .expect("the workspace states a rust-version");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let section = readme
        .find("## Two commands")
        .map(|i| &readme[i..])
        .expect("README has its \"Two commands\" section");
    let first_command = section.find("```").expect("the section has its commands");
    let before = &section[..first_command];
    assert!(
        before.contains("Prerequisite") && before.contains("Rust toolchain"),
        "the toolchain is not stated before the commands:\n{before}"
    );
    assert!(
        before.contains(&version),
        "README states another Rust version than the workspace's {version}:\n{before}"
    );
}
