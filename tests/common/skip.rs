//! The one skip policy of every test suite of the workspace (`tests/common` re-exports it;
//! `paper_repro/tests` include this file with `#[path = "../../tests/common/skip.rs"] mod skip;`).
//!
//! - [`require`]: a prerequisite the suite needs to test what it claims (the real model, a file
//!   `scripts/setup.sh` fetches, `fiu-run`, `bwrap`, AVX-512 where a test claims the AVX-512
//!   kernel). Missing under CI (`CI` set non-empty) or `ELM_REQUIRE_REAL_MODEL` (set, not `0`):
//!   the test FAILS. Missing elsewhere: the test is skipped ([`skip`]).
//! - [`optional`]: something a machine may lack by design and the suite does not need (a GPU,
//!   the CUDA runtime compiler, an idle thread team): never fails, always skipped and counted.
//! - A skip prints `skipped <test>: <why>` to stderr past libtest's capture (a passing test's
//!   output is hidden, this line is not) and appends `<binary> <test>: <why>` to the skip log
//!   ([`skip_log`]), which `scripts/test.sh` clears before the run and counts at its end.
// Each test binary uses only part of it.
#![allow(dead_code)]

use std::io::Write;
use std::path::PathBuf;

/// Set to `1` (scripts/test.sh does) and a missing prerequisite fails the test instead of
/// skipping it, so a broken download or setup cannot pass as a green run. `CI` does the same.
pub const REQUIRE_REAL_MODEL: &str = "ELM_REQUIRE_REAL_MODEL";

/// Path of the skip log (default: `target/test-skips.log` in the workspace root).
pub const SKIP_LOG: &str = "ELM_SKIP_LOG";

/// Whether a missing prerequisite fails: `CI` set non-empty, or `ELM_REQUIRE_REAL_MODEL` set
/// and not `0`.
pub fn strict() -> bool {
    let ci = std::env::var_os("CI").is_some_and(|v| !v.is_empty());
    let required = std::env::var_os(REQUIRE_REAL_MODEL).is_some_and(|v| !v.is_empty() && v != "0");
    ci || required
}

/// `available`, or else: under [`strict`] a panic naming `what` and `why`; elsewhere a skip
/// ([`skip`]) and `false`. Use as `if !common::require("fiu-run", ok, why) { return; }`.
pub fn require(what: &str, available: bool, why: impl std::fmt::Display) -> bool {
    if available {
        return true;
    }
    if strict() {
        panic!(
            "{}: {what} is missing and a missing prerequisite fails the test under CI or \
             {REQUIRE_REAL_MODEL}=1: {why}",
            current_test()
        );
    }
    skip(&format!("{what} missing: {why}"));
    false
}

/// `available`, or else a skip ([`skip`], also under CI) and `false`: for what a machine may
/// lack by design (a GPU, NVRTC), never a failure.
pub fn optional(what: &str, available: bool, why: impl std::fmt::Display) -> bool {
    if available {
        return true;
    }
    skip(&format!("{what} not here (optional): {why}"));
    false
}

/// Records that the running test skipped its work: prints `skipped <test>: <why>` to stderr
/// and appends `<binary> <test>: <why>` to the skip log.
pub fn skip(why: &str) {
    let test = current_test();
    let _ = writeln!(std::io::stderr(), "skipped {test}: {why}");
    let path = skip_log();
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    // One write of one line in append mode: lines of parallel tests and binaries do not mix.
    let line = format!("{} {test}: {why}", binary()).replace('\n', " ") + "\n";
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
    {
        let _ = f.write_all(line.as_bytes());
    }
}

/// `$ELM_SKIP_LOG`, or `target/test-skips.log` in the workspace root (the nearest directory
/// above this crate's manifest holding `Cargo.lock`).
pub fn skip_log() -> PathBuf {
    if let Some(p) = std::env::var_os(SKIP_LOG).filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = manifest
        .ancestors()
        .find(|d| d.join("Cargo.lock").is_file())
        .unwrap_or(manifest);
    root.join("target").join("test-skips.log")
}

/// The running test's name (libtest runs each test on a thread named after it).
pub fn current_test() -> String {
    std::thread::current()
        .name()
        .unwrap_or("<unnamed test>")
        .to_string()
}

/// The test binary's name without cargo's hash (`io_faults`).
fn binary() -> String {
    let exe = std::env::current_exe().ok();
    let stem = exe
        .as_ref()
        .and_then(|p| p.file_stem())
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    match stem.rsplit_once('-') {
        Some((name, hash)) if hash.chars().all(|c| c.is_ascii_hexdigit()) => name.to_string(),
        _ => stem,
    }
}
