//! Helpers shared by the engine's integration tests: the `preload` example library, a
//! per-process scratch directory, the C compiler, and running a program under the engine.
#![allow(dead_code)] // each test file uses its own subset

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

pub fn target_dir() -> PathBuf {
    // .../<target>/<profile>/deps/run_programs-<hash>
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(Path::parent)
        .expect("profile dir")
        .to_path_buf()
}

/// Path of the preload library, built (or brought up to date) once per test process:
/// `cargo test` does not always refresh the example's `libpreload.so` link, and a stale
/// library would test old engine code.
pub fn preload() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let lib = target_dir().join("examples").join("libpreload.so");
        let status = Command::new(env!("CARGO"))
            .args(["build", "-p", "oxgrind-engine", "--example", "preload"])
            .env(
                "CARGO_TARGET_DIR",
                target_dir().parent().expect("target dir"),
            )
            .status()
            .expect("run cargo build --example preload");
        assert!(status.success(), "building the preload example failed");
        assert!(lib.exists(), "{} missing", lib.display());
        lib
    })
}

pub fn work_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        remove_stale_dirs("oxgrind-engine-tests-");
        let d = std::env::temp_dir().join(format!("oxgrind-engine-tests-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("create temp dir");
        d
    })
    .clone()
}

/// Removes the temporary directories of earlier runs whose process is gone (a test binary
/// cannot clean up after itself: its tests run in parallel and it has no exit hook).
pub fn remove_stale_dirs(prefix: &str) {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix(prefix)) else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Compiles `src` (C or C++ by `ext`) with the given extra flags; returns the binary.
pub fn compile(name: &str, ext: &str, src: &str, flags: &[&str]) -> PathBuf {
    let dir = work_dir();
    let file = dir.join(format!("{name}.{ext}"));
    std::fs::write(&file, src).expect("write source");
    let bin = dir.join(name);
    let cc = if ext == "cc" { "g++" } else { "gcc" };
    let out = Command::new(cc)
        .arg("-O2")
        .arg("-o")
        .arg(&bin)
        .arg(&file)
        .args(flags)
        .output()
        .expect("run the C compiler");
    assert!(
        out.status.success(),
        "{cc} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    bin
}

pub fn run(cmd: &[&str], engine: bool, extra_env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(cmd[0]);
    c.args(&cmd[1..]).env_remove("LD_PRELOAD");
    if engine {
        c.env("LD_PRELOAD", preload())
            .env("OXGRIND_ENGINE_COUNT", "1");
    }
    for (k, v) in extra_env {
        c.env(k, v);
    }
    c.output().expect("run program")
}
