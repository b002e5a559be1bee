//! SIGKILL at seeded random moments of `elm train`, `elm lora`, `elm search --method gppo` and
//! `elm search --method enumerate`, then resume: the finished run equals an uninterrupted one
//! bit for bit, with no temporary left.
//!
//! A full disk, for real: the same commands with their run directory on a small tmpfs inside
//! bubblewrap (ENOSPC at different saves), then resumed on a larger disk.
//!
//! Faults injected into the checkpoint saves of the same four commands with libfiu (Debian `fiu-utils`:
//! `fiu-run -x` makes chosen POSIX calls fail): fsync and rename failing always or at random
//! points of the run, and open failing at random. Whatever happens, a failed run exits 1 with a
//! typed JSON error naming the file (and, for fsync and rename, the operation); what it left is
//! either resumable (`--resume`, faults gone) or, when not even the first checkpoint was
//! completed, refused by `--resume` with the instruction to start again; either way the run
//! then ends bit for bit where an uninterrupted run ends. Skipped, with the reason printed,
//! only where `fiu-run` cannot run (scripts/setup.sh installs it).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use elm::model::config::Arch;
use elm::model::{ModelConfig, ModelWeights};

struct Setup {
    _dir: common::TempDir,
    root: PathBuf,
    model: PathBuf,
    data: PathBuf,
    config: PathBuf,
    lora_config: PathBuf,
    /// Longer runs (60 steps, a checkpoint every 5) for the kill harness.
    long_config: PathBuf,
    long_lora_config: PathBuf,
}

/// The resumable commands under test.
#[derive(Clone, Copy, Debug)]
enum Job {
    Train,
    Lora,
    /// `elm search --method gppo`.
    Gppo,
    /// `elm search --method enumerate` (resumable start by start).
    Enumerate,
}

fn setup() -> Setup {
    let dir = common::TempDir::new("faults");
    let root = dir.path().to_path_buf();
    let w = ModelWeights::random(&ModelConfig::tiny(Arch::Llama), 3);
    let model = root.join("tiny");
    common::write_word_model(&w, &model);
    let data = root.join("train.jsonl");
    common::write_word_corpus(&data, 8, 7);
    let config = root.join("train.json");
    std::fs::write(&config, r#"{"steps": 6, "checkpoint_every": 2}"#).unwrap();
    let lora_config = root.join("lora.json");
    std::fs::write(
        &lora_config,
        r#"{"steps": 6, "checkpoint_every": 2, "seq_len": 16}"#,
    )
    .unwrap();
    let long_config = root.join("train-long.json");
    std::fs::write(&long_config, r#"{"steps": 60, "checkpoint_every": 5}"#).unwrap();
    let long_lora_config = root.join("lora-long.json");
    std::fs::write(
        &long_lora_config,
        r#"{"steps": 60, "checkpoint_every": 5, "seq_len": 16}"#,
    )
    .unwrap();
    Setup {
        _dir: dir,
        root,
        model,
        data,
        config,
        lora_config,
        long_config,
        long_lora_config,
    }
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// Whether `fiu-run` runs here; if not, the skip policy (a failure under CI or
/// `ELM_REQUIRE_REAL_MODEL=1`, else a counted skip).
fn have_fiu() -> bool {
    let probe = fiu_available();
    common::require("fiu-run", probe.is_ok(), probe.err().unwrap_or_default())
}

/// Whether bubblewrap mounts a sized tmpfs here; if not, the skip policy.
fn have_small_disk() -> bool {
    let probe = small_disk_available();
    common::require("bwrap", probe.is_ok(), probe.err().unwrap_or_default())
}

fn fiu_available() -> Result<(), String> {
    match Command::new("fiu-run").args(["-x", "true"]).output() {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!(
            "fiu-run -x true failed: {}",
            String::from_utf8_lossy(&o.stderr)
        )),
        Err(e) => Err(format!(
            "fiu-run not found ({e}); scripts/setup.sh installs fiu-utils"
        )),
    }
}

/// `job` on the tiny model into `out`: fresh (`resume` false) or `--resume`, under the libfiu
/// commands `faults` (none: run plainly).
fn run(st: &Setup, job: Job, out: &Path, resume: bool, force: bool, faults: &[&str]) -> Output {
    command(st, job, out, resume, force, faults, false)
        .output()
        .unwrap()
}

fn command(
    st: &Setup,
    job: Job,
    out: &Path,
    resume: bool,
    force: bool,
    faults: &[&str],
    long: bool,
) -> Command {
    let mut args: Vec<String> = match job {
        Job::Train => vec!["train".into(), "--model".into(), s(&st.model)],
        Job::Lora => vec!["lora".into(), "--model".into(), s(&st.model)],
        Job::Gppo => vec![
            "search".into(),
            "--method".into(),
            "gppo".into(),
            "--num-replaced".into(),
            "2".into(),
            "--model".into(),
            s(&st.model),
        ],
        Job::Enumerate => vec![
            "search".into(),
            "--method".into(),
            "enumerate".into(),
            "--num-replaced".into(),
            "2".into(),
            "--model".into(),
            s(&st.model),
        ],
    };
    if resume {
        args.push("--resume".into());
    } else {
        match job {
            Job::Train => args.extend([
                "--start".into(),
                "1".into(),
                "--num-replaced".into(),
                "2".into(),
                "--config".into(),
                s(if long { &st.long_config } else { &st.config }),
            ]),
            Job::Lora => args.extend([
                "--config".into(),
                s(if long {
                    &st.long_lora_config
                } else {
                    &st.lora_config
                }),
            ]),
            // Checkpoints at its starting point, every 20 steps and at the end.
            Job::Gppo => args.extend([
                "--seq-len".into(),
                "16".into(),
                "--steps".into(),
                if long { "40" } else { "24" }.into(),
            ]),
            // Every start of the tiny model's 3 windows, its entry written after each.
            Job::Enumerate => args.extend([
                "--seq-len".into(),
                "16".into(),
                "--steps".into(),
                if long { "12" } else { "3" }.into(),
            ]),
        }
    }
    if force {
        args.push("--force".into());
    }
    args.extend([
        "--out".into(),
        s(out),
        "--eval-examples".into(),
        // The enumeration scores each start on held-out problems (GSM8K test, in the word
        // tokenizer's unknown tokens); the others need none.
        if matches!(job, Job::Enumerate) {
            "2"
        } else {
            "0"
        }
        .into(),
        "--data".into(),
        s(&st.data),
        "--json".into(),
    ]);
    let mut cmd = elm_under(faults);
    cmd.args(&args);
    cmd
}

/// A safetensors file's tensors (f32 bits) and metadata in name order: what "bit for bit" compares
/// (the file's header lists its metadata in hash-map order, which differs from run to run).
fn tensors_bits(path: &Path) -> Vec<u8> {
    let f = elm::io::tensor_file::load_f32_tensors(path).unwrap();
    let mut names: Vec<&String> = f.tensors.keys().collect();
    names.sort();
    let mut bytes = vec![];
    for n in names {
        bytes.extend(n.as_bytes());
        bytes.extend(format!("{:?}", f.tensors[n].shape()).into_bytes());
        bytes.extend(f.tensors[n].iter().flat_map(|x| x.to_bits().to_le_bytes()));
    }
    let mut meta: Vec<_> = f.metadata.iter().collect();
    meta.sort();
    bytes.extend(format!("{meta:?}").into_bytes());
    bytes
}

/// What a finished run produced: the trained module, or the merged LoRA model.
fn result_bytes(job: Job, out: &Path) -> Vec<u8> {
    match job {
        Job::Train => tensors_bits(&out.join("module.safetensors")),
        Job::Lora => tensors_bits(&out.join("model").join("model.safetensors")),
        // GPPO: the candidates' parameters at the last checkpoint and the policy.
        Job::Gppo => {
            let state: serde_json::Value = serde_json::from_str(
                &std::fs::read_to_string(out.join("gppo_state.json")).unwrap(),
            )
            .unwrap();
            let step_dir = state["step_dir"].as_str().unwrap();
            let mut bytes = tensors_bits(&out.join(step_dir).join("params.safetensors"));
            bytes.extend(state["policy"].to_string().into_bytes());
            bytes
        }
        // The enumeration's figures (its entries' wall times differ from run to run).
        Job::Enumerate => {
            let e: serde_json::Value = serde_json::from_str(
                &std::fs::read_to_string(out.join("enumeration.json")).unwrap(),
            )
            .unwrap();
            let mut bytes = vec![];
            for entry in e["entries"].as_array().unwrap() {
                for k in ["start", "nll", "nll_init"] {
                    bytes.extend(entry[k].to_string().into_bytes());
                }
            }
            bytes
        }
    }
}

/// `elm`, under `fiu-run -x` with each of `faults` enabled (`-c`) when there are any.
fn elm_under(faults: &[&str]) -> Command {
    if faults.is_empty() {
        return Command::new(env!("CARGO_BIN_EXE_elm"));
    }
    let mut c = Command::new("fiu-run");
    c.arg("-x");
    for f in faults {
        c.args(["-c", f]);
    }
    c.arg(env!("CARGO_BIN_EXE_elm"));
    c
}

/// Whether bubblewrap can mount a size-limited tmpfs here (the full-disk cases need it).
fn small_disk_available() -> Result<(), String> {
    let probe = Command::new("bwrap")
        .args(["--dev-bind", "/", "/", "--size", "65536", "--tmpfs", "/mnt"])
        .arg("true")
        .output();
    match &probe {
        Ok(o) if o.status.success() => Ok(()),
        _ => Err(format!("bwrap cannot mount a sized tmpfs here: {probe:?}")),
    }
}

/// `sh -c script` inside bubblewrap with a tmpfs of `size` bytes over `mnt` (a full disk
/// there once `size` is written; the rest of the file system as it is).
fn on_small_disk(mnt: &Path, size: u64, script: &str) -> Output {
    Command::new("bwrap")
        .args([
            "--dev-bind",
            "/",
            "/",
            "--size",
            &size.to_string(),
            "--tmpfs",
        ])
        .arg(mnt)
        .args(["sh", "-c", script])
        .output()
        .unwrap()
}

/// The command line a job runs, as the README's fault table names it.
fn command_name(job: Job) -> &'static str {
    match job {
        Job::Train => "elm train",
        Job::Lora => "elm lora",
        Job::Gppo => "elm search --method gppo",
        Job::Enumerate => "elm search --method enumerate",
    }
}

/// One row of the README's fault table (only finished runs that equal the uninterrupted one,
/// with no temporary left, get this far).
fn outcome(
    job: Job,
    fault: &str,
    failed: bool,
    error: serde_json::Value,
    recovery: &str,
) -> serde_json::Value {
    serde_json::json!({
        "command": command_name(job),
        "fault": fault,
        "failed": failed,
        "error": error,
        "recovery": recovery,
        "result_equals_uninterrupted_run": true,
        "temporaries_left": 0,
    })
}

/// `ELM_FAULT_REPORT/NAME.json`, which `scripts/fault-table.sh` turns into the README's table.
fn write_report(name: &str, outcomes: &[serde_json::Value]) {
    if let Some(dir) = std::env::var_os("ELM_FAULT_REPORT") {
        let path = PathBuf::from(dir).join(format!("{name}.json"));
        std::fs::write(&path, serde_json::to_string_pretty(outcomes).unwrap()).unwrap();
    }
}

/// The JSON error a failed run printed on stdout.
fn json_error(o: &Output) -> serde_json::Value {
    let stdout = String::from_utf8_lossy(&o.stdout);
    let line = stdout.lines().last().unwrap_or("");
    serde_json::from_str::<serde_json::Value>(line)
        .unwrap_or_else(|e| panic!("no JSON error ({e}): stdout {stdout:?}"))["error"]
        .clone()
}

#[test]
fn failing_fsync_rename_and_open_never_lose_or_tear_a_checkpoint() {
    if !have_fiu() {
        return;
    }
    let st = setup();
    for job in [Job::Train, Job::Lora, Job::Gppo, Job::Enumerate] {
        check_job(&st, job);
    }
}

fn check_job(st: &Setup, job: Job) {
    let reference = st.root.join(format!("{job:?}-reference"));
    let o = run(st, job, &reference, false, false, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let want = result_bytes(job, &reference);

    // (libfiu point, the operation our error names, how it is enabled); random points draw
    // anew in every run, so across cases failures land on different saves.
    let cases: &[(&str, Option<&str>, &str)] = &[
        (
            "posix/io/sync/fsync",
            Some("fsync"),
            "enable name=posix/io/sync/fsync",
        ),
        (
            "posix/io/sync/fsync",
            Some("fsync"),
            "enable_random name=posix/io/sync/fsync,probability=0.3",
        ),
        (
            "posix/io/dir/rename",
            Some("rename"),
            "enable name=posix/io/dir/rename",
        ),
        (
            "posix/io/dir/rename",
            Some("rename"),
            "enable_random name=posix/io/dir/rename,probability=0.3",
        ),
        (
            "posix/io/sync/fsync",
            Some("fsync"),
            "enable_random name=posix/io/sync/fsync,probability=0.05",
        ),
        (
            "posix/io/dir/rename",
            Some("rename"),
            "enable_random name=posix/io/dir/rename,probability=0.1",
        ),
        (
            "posix/io/oc/open",
            None,
            "enable_random name=posix/io/oc/open,probability=0.05",
        ),
    ];
    let mut outcomes: Vec<serde_json::Value> = vec![];
    for (i, (point, op, enable)) in cases.iter().enumerate() {
        let out = st.root.join(format!("{job:?}-case-{i}"));
        let faulty = run(st, job, &out, false, false, &[enable]);
        let failed = !faulty.status.success();
        let mut what = format!("{job:?}, {enable}: ");
        let mut error = serde_json::Value::Null;
        if failed {
            assert_eq!(faulty.status.code(), Some(1), "{enable}: exit status");
            let e = json_error(&faulty);
            assert!(e["file"].is_string(), "{enable}: error names no file: {e}");
            if let Some(op) = op {
                let msg = e["message"].as_str().unwrap();
                assert!(msg.contains(op), "{enable}: message names no {op}: {msg}");
                assert_eq!(e["kind"], "io", "{enable}: {e}");
            }
            what += &format!("failed ({})", e["message"].as_str().unwrap_or(""));
            error = e;
        } else {
            what += "not hit";
        }
        // Faults gone: resume what the failed run left, or, when it completed no checkpoint,
        // start again as --resume's refusal says.
        let recovery = finish(st, job, &out, false);
        what += match recovery {
            Recovery::Resumed => "; resumed",
            Recovery::FromRequest => "; no checkpoint completed, resumed from the request",
            Recovery::StartedAgain => "; nothing saved, started again",
        };
        let recovery = recovery.describe();
        assert_finished_as(job, &out, &want, &format!("{point}: {what}"));
        println!("{what}");
        let recovery = if failed {
            recovery
        } else {
            "not hit: the run finished"
        };
        outcomes.push(outcome(job, enable, failed, error, recovery));
    }
    write_report(&format!("{job:?}"), &outcomes);
}

fn walk(dir: &Path) -> Vec<String> {
    let mut names = vec![];
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            names.push(e.file_name().to_string_lossy().into_owned());
            if p.is_dir() {
                names.extend(walk(&p));
            }
        }
    }
    names
}

/// How a run stopped by a fault or a kill was finished.
#[derive(Clone, Copy)]
enum Recovery {
    Resumed,
    /// No checkpoint had completed: `--resume` started the run again from its saved request.
    FromRequest,
    /// Not even the request was saved: `--resume` refused, naming the missing files.
    StartedAgain,
}

impl Recovery {
    fn describe(self) -> &'static str {
        match self {
            Recovery::Resumed => "--resume continued from the last completed checkpoint",
            Recovery::FromRequest => {
                "no checkpoint had completed: --resume started the run again from its saved request"
            }
            Recovery::StartedAgain => {
                "nothing had been saved, not even the request: --resume refused naming the missing files; started again with --force"
            }
        }
    }
}

/// Runs `job` in `out` to the end after a fault or a SIGKILL: `--resume` (from the last
/// checkpoint, or from the saved request when no checkpoint completed; a finished run resumes
/// as a no-op), otherwise again from the start with `--force`, as `--resume`'s refusal says.
fn finish(st: &Setup, job: Job, out: &Path, long: bool) -> Recovery {
    let resumed = command(st, job, out, true, false, &[], long)
        .output()
        .unwrap();
    if resumed.status.success() {
        let said = String::from_utf8_lossy(&resumed.stderr);
        if said.contains("no checkpoint was completed") {
            return Recovery::FromRequest;
        }
        return Recovery::Resumed;
    }
    let e = json_error(&resumed);
    let msg = e["message"].as_str().unwrap_or("").to_string();
    assert!(
        msg.contains("state.json") || msg.contains("enumeration.json"),
        "{job:?}: resume refused for another reason: {msg}"
    );
    let again = command(st, job, out, false, true, &[], long)
        .output()
        .unwrap();
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    Recovery::StartedAgain
}

/// The finished run in `out` equals the uninterrupted one (`want`) and left no temporary.
fn assert_finished_as(job: Job, out: &Path, want: &[u8], what: &str) {
    assert!(
        result_bytes(job, out) == want,
        "{job:?}, {what}: the finished run differs from the uninterrupted one"
    );
    let temps: Vec<String> = walk(out)
        .into_iter()
        .filter(|n| n.contains(".tmp"))
        .collect();
    assert!(
        temps.is_empty(),
        "{job:?}, {what}: temporaries left: {temps:?}"
    );
}

#[test]
fn sigkill_at_random_moments_then_resume_equals_the_uninterrupted_run() {
    use rand::{rngs::StdRng, Rng, SeedableRng};
    use std::time::{Duration, Instant};
    let st = setup();
    for job in [Job::Train, Job::Lora, Job::Gppo, Job::Enumerate] {
        // Two uninterrupted runs: the second (warm caches) times the window the kills sample.
        let mut full = Duration::MAX;
        let mut want = vec![];
        for r in 0..2 {
            let reference = st.root.join(format!("{job:?}-long-reference-{r}"));
            let t0 = Instant::now();
            let o = command(&st, job, &reference, false, false, &[], true)
                .output()
                .unwrap();
            full = full.min(t0.elapsed());
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            let bytes = result_bytes(job, &reference);
            assert!(
                r == 0 || bytes == want,
                "{job:?}: two uninterrupted runs differ"
            );
            want = bytes;
        }
        let mut rng = StdRng::seed_from_u64(29);
        let mut how = vec![];
        for k in 0..10 {
            let out = st.root.join(format!("{job:?}-kill-{k}"));
            let mut child = command(&st, job, &out, false, false, &[], true)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap();
            let at = full.mul_f64(rng.gen_range(0.0..1.0));
            std::thread::sleep(at);
            // SIGKILL (a child that already finished is simply reaped).
            let _ = child.kill();
            let status = child.wait().unwrap();
            let killed = !status.success();
            let then = match finish(&st, job, &out, true) {
                Recovery::Resumed => "resumed",
                Recovery::FromRequest => "resumed from the request",
                Recovery::StartedAgain => "started again",
            };
            assert_finished_as(job, &out, &want, &format!("killed at {at:?} ({then})"));
            how.push(format!(
                "{:.0} ms{}: {then}",
                at.as_secs_f64() * 1e3,
                if killed { "" } else { " (had finished)" }
            ));
        }
        println!("{job:?} (uninterrupted {full:?}): {}", how.join("; "));
    }
}

/// Bytes under `dir` (files only).
fn dir_bytes(dir: &Path) -> u64 {
    let mut n = 0;
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            n += if p.is_dir() {
                dir_bytes(&p)
            } else {
                e.metadata().map_or(0, |m| m.len())
            };
        }
    }
    n
}

/// A full disk, for real: each command runs inside bubblewrap with its run directory on a
/// tmpfs of a chosen size (`--size`, no privileges needed), from a quarter of what the
/// finished run occupies to more than all of it, so that ENOSPC lands in different saves. The
/// directory is copied out when the command stops ("space freed"): a failed run exits 1 with a
/// typed I/O error naming the file and "No space left on device", and the copy, resumed (or
/// started again when not even the first save completed), ends where an uninterrupted run ends.
#[test]
fn a_full_disk_stops_the_run_with_a_typed_error_and_resume_finishes_it() {
    if !have_small_disk() {
        return;
    }
    let st = setup();
    let mut outcomes = vec![];
    for job in [Job::Train, Job::Lora, Job::Gppo, Job::Enumerate] {
        let reference = st.root.join(format!("{job:?}-enospc-reference"));
        let o = run(&st, job, &reference, false, false, &[]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let want = result_bytes(job, &reference);
        let full = dir_bytes(&reference);
        // tmpfs counts whole 4 KiB pages per file: a run of a few small files gets page steps.
        let sizes: Vec<u64> = if full < 16 * 4096 {
            vec![4096, 2 * 4096, 3 * 4096, 4 * 4096, 16 * 4096]
        } else {
            [0.25, 0.5, 0.75, 1.0, 1.5]
                .iter()
                .map(|f| (full as f64 * f) as u64)
                .collect()
        };
        for (i, size) in sizes.into_iter().enumerate() {
            let mnt = st.root.join(format!("{job:?}-disk-{i}"));
            std::fs::create_dir_all(&mnt).unwrap();
            let inside = mnt.join("run");
            let copy = st.root.join(format!("{job:?}-enospc-{i}"));
            let cmd = command(&st, job, &inside, false, false, &[], false);
            let line: Vec<String> = std::iter::once(cmd.get_program())
                .chain(cmd.get_args())
                .map(|a| format!("'{}'", a.to_string_lossy()))
                .collect();
            let script = format!(
                "{}; rc=$?; cp -a '{}' '{}' 2>/dev/null; exit $rc",
                line.join(" "),
                inside.display(),
                copy.display()
            );
            let o = on_small_disk(&mnt, size, &script);
            let failed = !o.status.success();
            let mut what = format!("{job:?}, tmpfs of {size} bytes: ");
            let mut error = serde_json::Value::Null;
            if failed {
                assert_eq!(o.status.code(), Some(1), "{what}exit status");
                let e = json_error(&o);
                let msg = e["message"].as_str().unwrap_or("");
                assert!(e["file"].is_string(), "{what}error names no file: {e}");
                assert!(msg.contains("No space left"), "{what}not ENOSPC: {e}");
                assert_eq!(e["kind"], "io", "{what}{e}");
                what += &format!("failed ({msg})");
                error = e;
            } else {
                what += "fits";
            }
            let recovery = if copy.exists() {
                match finish(&st, job, &copy, false) {
                    Recovery::Resumed => "moved to a larger disk, --resume continued",
                    other => other.describe(),
                }
            } else {
                // Not even the run directory could be created: nothing to keep.
                let o = command(&st, job, &copy, false, false, &[], false)
                    .output()
                    .unwrap();
                assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
                "nothing was written: started again"
            };
            what += &format!("; {recovery}");
            assert_finished_as(job, &copy, &want, &what);
            println!("{what}");
            let fault = format!("ENOSPC: run directory on a {size}-byte tmpfs");
            let recovery = if failed {
                recovery
            } else {
                "not hit: the run fits"
            };
            outcomes.push(outcome(job, &fault, failed, error, recovery));
        }
    }
    write_report("enospc", &outcomes);
}

/// `elm quantize` writes one file: with fsync, rename or open failing (libfiu), or its disk
/// full (tmpfs), it exits 1 with a typed error naming the file, leaves no file at `--out` and
/// no temporary, and a rerun writes the same bytes as a run that never failed.
#[test]
fn a_failing_or_full_disk_never_leaves_a_torn_quantized_file() {
    if !have_fiu() {
        return;
    }
    let dir = common::TempDir::new("quantize-faults");
    let root = dir.path();
    let cfg = ModelConfig {
        intermediate_size: 64,
        ..common::tiny_config(Arch::Llama, 5)
    };
    let w = ModelWeights::random(&cfg, 5);
    let model = root.join("tiny");
    common::write_word_model(&w, &model);
    let ckpt = root.join("ckpt");
    let o = Command::new(env!("CARGO_BIN_EXE_elm"))
        .args(["compress", "--model", &s(&model), "--start", "1"])
        .args(["--num-replaced", "2", "--out", &s(&ckpt)])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let quantize = |out: &Path, faults: &[&str]| {
        let mut c = elm_under(faults);
        c.args(["quantize", "--model", &s(&model), "--elm", &s(&ckpt)])
            .args(["--format", "q8_0", "--json", "--out", &s(out)]);
        c.output().unwrap()
    };
    let reference = root.join("reference.gguf");
    let o = quantize(&reference, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let want = std::fs::read(&reference).unwrap();
    for (i, (enable, op)) in [
        ("enable name=posix/io/sync/fsync", "fsync"),
        ("enable name=posix/io/dir/rename", "rename"),
        ("enable name=posix/io/oc/open", ""),
        (
            "enable_random name=posix/io/rw/write,probability=0.5",
            "write",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let sub = root.join(format!("case-{i}"));
        std::fs::create_dir_all(&sub).unwrap();
        let out = sub.join("model.gguf");
        let o = quantize(&out, &[enable]);
        println!(
            "quantize, {enable}: {}",
            if o.status.success() {
                "not hit"
            } else {
                "failed"
            }
        );
        if o.status.success() {
            // Only a random fault may miss every call; then the file is whole.
            assert!(enable.starts_with("enable_random"), "{enable}: not hit");
            assert_eq!(std::fs::read(&out).unwrap(), want, "{enable}");
        } else {
            // Exit 1, never a panic (101), even when the fault also hits stdout and stderr.
            assert_eq!(o.status.code(), Some(1), "{enable}");
            // Random write faults also hit stdout and stderr (the report, the error line), so
            // only the deterministic faults are checked for their message.
            if !enable.contains("posix/io/rw/write") {
                let e = json_error(&o);
                assert!(e["file"].is_string(), "{enable}: {e}");
                assert!(e["message"].as_str().unwrap().contains(op), "{enable}: {e}");
                assert!(!out.exists(), "{enable}: a file was left at --out");
            }
            // Whatever failed, a file at --out is whole: the write failed before the rename
            // (no file), or the report of a finished write failed (stdout).
            if out.exists() {
                assert_eq!(std::fs::read(&out).unwrap(), want, "{enable}: torn file");
                std::fs::remove_file(&out).unwrap();
            }
        }
        let left: Vec<String> = walk(&sub)
            .into_iter()
            .filter(|n| n.contains(".tmp"))
            .collect();
        assert!(left.is_empty(), "{enable}: temporaries left: {left:?}");
        let o = quantize(&out, &[]);
        assert!(o.status.success() || out.exists(), "{enable}: rerun failed");
        if !o.status.success() {
            // The fault missed and the file exists: a rerun needs --force, as it says.
            assert!(String::from_utf8_lossy(&o.stdout).contains("--force"));
        }
        assert_eq!(std::fs::read(&out).unwrap(), want, "{enable}: rerun");
    }
    // Full disk: a tmpfs of half the file's size.
    if !have_small_disk() {
        return;
    }
    let mnt = root.join("small-disk");
    std::fs::create_dir_all(&mnt).unwrap();
    let out = mnt.join("model.gguf");
    let script = format!(
        "'{}' quantize --model '{}' --elm '{}' --format q8_0 --json --out '{}'; rc=$?; ls -a '{}'; exit $rc",
        env!("CARGO_BIN_EXE_elm"),
        model.display(),
        ckpt.display(),
        out.display(),
        mnt.display()
    );
    let o = on_small_disk(&mnt, (want.len() / 2) as u64, &script);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let stdout = String::from_utf8_lossy(&o.stdout);
    let e: serde_json::Value =
        serde_json::from_str(stdout.lines().find(|l| l.starts_with('{')).unwrap_or("{}")).unwrap();
    let msg = e["error"]["message"].as_str().unwrap_or("");
    assert!(msg.contains("No space left"), "{stdout}");
    // What the directory held when the command had stopped: no file, no temporary.
    let listed: Vec<&str> = stdout.lines().filter(|l| !l.starts_with('{')).collect();
    assert!(
        listed.iter().all(|l| *l == "." || *l == ".."),
        "left on the full disk: {listed:?}"
    );
}
