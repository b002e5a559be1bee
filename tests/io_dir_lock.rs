//! One writer per run directory (`elm::io::DirLock`): a second holder is refused naming the
//! first one's PID, in the library and through the CLI (JSON error of kind `locked`); a lock
//! file left by a dead process is taken over, and says so; a clean exit leaves nobody to report.

mod common;

use std::process::Command;

use elm::io::{DirLock, LockHolder};
use elm::ElmError;

fn fresh(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("elm-lock-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn second_holder_is_refused_with_the_first_ones_pid() {
    let dir = fresh("twice");
    let first = DirLock::acquire(&dir, "first command").unwrap();
    assert!(first.took_over_from.is_none());
    let err = DirLock::acquire(&dir, "second command").unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, ElmError::DirectoryLocked { .. }), "{err:?}");
    assert!(msg.contains(&std::process::id().to_string()), "{msg}");
    assert!(msg.contains("first command"), "{msg}");
    drop(first);
    // Released: the next holder has nobody to report.
    let again = DirLock::acquire(&dir, "third command").unwrap();
    assert!(again.took_over_from.is_none());
    drop(again);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_dead_holders_lock_is_taken_over_and_reported() {
    let dir = fresh("dead");
    // A child process takes the lock and is killed with SIGKILL while holding it.
    let mut child = Command::new("sh").args(["-c", "sleep 30"]).spawn().unwrap();
    let dead = LockHolder {
        pid: child.id(),
        command: "elm train --out somewhere".into(),
    };
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join(elm::io::dir_lock::LOCK_FILE),
        serde_json::to_string(&dead).unwrap(),
    )
    .unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let lock = DirLock::acquire(&dir, "new command").unwrap();
    assert_eq!(lock.took_over_from.as_ref(), Some(&dead));
    let note = lock.takeover_note().unwrap();
    assert!(note.contains(&dead.pid.to_string()) && note.contains("no longer running"));
    drop(lock);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn cli_commands_refuse_a_directory_another_process_writes() {
    let model = common::fixture("io/hf_tiny_llama");
    let dir = fresh("cli");
    let holder = DirLock::acquire(&dir, "the test's holder").unwrap();
    let args = |cmd: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = cmd.iter().map(|s| s.to_string()).collect();
        v.extend([
            "--model".into(),
            model.display().to_string(),
            "--out".into(),
            dir.display().to_string(),
            "--json".into(),
        ]);
        v
    };
    for cmd in [
        &["compress", "--start", "0", "--num-replaced", "1"][..],
        &[
            "train",
            "--start",
            "0",
            "--num-replaced",
            "1",
            "--steps",
            "1",
        ][..],
        &["lora", "--steps", "1"][..],
        &["train", "--resume"][..],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_elm"))
            .args(args(cmd))
            .output()
            .unwrap();
        assert!(!out.status.success(), "{cmd:?} ran on a locked directory");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let v: serde_json::Value = serde_json::from_str(stdout.trim())
            .unwrap_or_else(|e| panic!("{cmd:?}: {e}: {stdout}"));
        assert_eq!(v["error"]["kind"], "locked", "{cmd:?}: {v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains(&std::process::id().to_string()),
            "{cmd:?}: {msg}"
        );
    }
    // Nothing was written beside the lock file.
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, [elm::io::dir_lock::LOCK_FILE]);
    drop(holder);
    let out = Command::new(env!("CARGO_BIN_EXE_elm"))
        .args(args(&["compress", "--start", "0", "--num-replaced", "1"]))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
