//! The stage cache under SIGKILL and failing writes: a chain of stages keyed like the study's
//! (this test binary re-run as a child, see [`stage_chain_child`]) killed at 10 seeded random
//! moments, or run under libfiu with fsync, rename or open failing, then run again without
//! faults: it ends with the results of an uninterrupted run, every stage record in
//! `OUT/stages` whole JSON, no temporary left.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use paper_repro::stage::Stages;
use serde_json::{json, Value};

#[path = "../../tests/common/skip.rs"]
mod skip;

/// `OUT` and `N` of the child run, through the environment.
const CHILD_ENV: &str = "PAPER_REPRO_STAGE_CHAIN";

/// The child: N stages, each keyed by the previous one's key, each writing a file into its
/// work directory and taking a few milliseconds; prints `{"results": [...]}` and exits 0, or
/// exits 1 with the error on stderr. Does nothing in a normal test run.
#[test]
fn stage_chain_child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (out, n) = spec.split_once('|').unwrap();
    match chain_run(Path::new(out), n.parse().unwrap()) {
        Ok(v) => {
            println!("{v}");
            std::process::exit(0)
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1)
        }
    }
}

fn chain_run(out: &Path, n: u64) -> Result<Value, paper_repro::error::ReproError> {
    let mut stages = Stages::new(out, false, n as f64)?;
    let (mut prev, mut sum, mut results) = (String::new(), 0u64, vec![]);
    for i in 0..n {
        let config = json!({ "i": i, "after": prev });
        let done = stages.run::<_, Value>("link", &config, 1.0, |dir| {
            std::thread::sleep(Duration::from_millis(15));
            let v = sum.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(i);
            let file = dir.join("value.txt");
            elm::io::write_atomic(&file, v.to_string().as_bytes()).map_err(|source| {
                paper_repro::error::ReproError::Elm {
                    what: format!("writing {}", file.display()),
                    source,
                }
            })?;
            Ok(json!({ "value": v }))
        })?;
        sum = done.value["value"].as_u64().unwrap_or(0);
        results.push(sum);
        prev = done.key;
    }
    Ok(json!({ "results": results }))
}

/// The chain as a child process writing into `out` (under `wrapper`, e.g. `fiu-run`).
fn chain(out: &Path, wrapper: &[&str]) -> Command {
    let exe = std::env::current_exe().unwrap();
    let mut c = match wrapper.split_first() {
        Some((w, rest)) => {
            let mut c = Command::new(w);
            c.args(rest).arg(&exe);
            c
        }
        None => Command::new(&exe),
    };
    c.args([
        "--exact",
        "stage_chain_child",
        "--nocapture",
        "--test-threads",
        "1",
    ])
    .env(CHILD_ENV, format!("{}|{N}", out.display()));
    c
}

/// A fresh directory per call: the tests run in parallel threads of one process and each
/// computes its own reference (one path per tag let one test remove the other's run).
fn tmp(tag: &str) -> PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, Ordering::Relaxed);
    let d = std::env::temp_dir().join(format!("stage-faults-{}-{n}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

const N: u64 = 12;

/// The child's results line (libtest prints its own lines around it).
fn results(o: &std::process::Output) -> Value {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .find(|l| l.starts_with("{\"results\""))
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or(Value::Null)
}

/// Every record parses, no temporary anywhere under `out`.
fn assert_clean(out: &Path, what: &str) {
    let mut stack = vec![out.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            assert!(
                !name.contains(".tmp"),
                "{what}: temporary left: {}",
                p.display()
            );
            if p.is_dir() {
                stack.push(p);
            } else if d.ends_with("stages") {
                let text = std::fs::read_to_string(&p).unwrap();
                serde_json::from_str::<serde_json::Value>(&text)
                    .unwrap_or_else(|e| panic!("{what}: torn record {}: {e}", p.display()));
            }
        }
    }
}

fn reference() -> (Value, Duration) {
    let out = tmp("reference");
    let t0 = Instant::now();
    let o = chain(&out, &[]).output().unwrap();
    let took = t0.elapsed();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let _ = std::fs::remove_dir_all(&out);
    (results(&o), took)
}

#[test]
fn a_killed_chain_resumes_from_its_records_and_ends_as_uninterrupted() {
    use rand::{rngs::StdRng, Rng, SeedableRng};
    let (want, took) = reference();
    let mut rng = StdRng::seed_from_u64(7);
    for k in 0..10 {
        let out = tmp(&format!("kill-{k}"));
        let mut child = chain(&out, &[])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(took.mul_f64(rng.gen_range(0.0..1.0)));
        let _ = child.kill();
        child.wait().unwrap();
        let kept = std::fs::read_dir(out.join("stages")).map_or(0, |d| d.count());
        println!("kill {k}: {kept} of {N} records kept");
        let o = chain(&out, &[]).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(results(&o), want, "kill {k}");
        assert_clean(&out, &format!("kill {k}"));
        let _ = std::fs::remove_dir_all(&out);
    }
}

#[test]
fn failing_fsync_rename_and_open_never_tear_a_stage_record() {
    let fiu = Command::new("fiu-run")
        .args(["-x", "true"])
        .status()
        .is_ok_and(|s| s.success());
    if !skip::require(
        "fiu-run",
        fiu,
        "fiu-run cannot run here (scripts/setup.sh installs fiu-utils)",
    ) {
        return;
    }
    let (want, _) = reference();
    for (i, enable) in [
        "enable name=posix/io/sync/fsync",
        "enable name=posix/io/dir/rename",
        "enable_random name=posix/io/sync/fsync,probability=0.2",
        "enable_random name=posix/io/dir/rename,probability=0.2",
        "enable_random name=posix/io/oc/open,probability=0.1",
    ]
    .into_iter()
    .enumerate()
    {
        let out = tmp(&format!("fault-{i}"));
        let o = chain(&out, &["fiu-run", "-x", "-c", enable])
            .output()
            .unwrap();
        let records = |out: &Path| std::fs::read_dir(out.join("stages")).map_or(0, |d| d.count());
        println!(
            "{enable}: {} after {} of {N} records",
            if o.status.success() {
                "finished"
            } else {
                "failed"
            },
            records(&out)
        );
        if !o.status.success() {
            assert_eq!(o.status.code(), Some(1), "{enable}: never a panic");
        } else {
            assert!(enable.starts_with("enable_random"), "{enable}: not hit");
        }
        let o = chain(&out, &[]).output().unwrap();
        assert!(
            o.status.success(),
            "{enable}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert_eq!(results(&o), want, "{enable}");
        assert_clean(&out, enable);
        let _ = std::fs::remove_dir_all(&out);
    }
}
