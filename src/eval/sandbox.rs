//! Runs untrusted Python (model-generated code plus its tests) in a child process, never in
//! the elm process.
//!
//! The boundary is bubblewrap (`bwrap`): the program sees a read-only root, private tmpfs over
//! the temp directories and over every home directory, only its own directory writable, every
//! namespace unshared (no network, its own PIDs), and it dies with its parent. Where `bwrap`
//! cannot run, the task is refused unless [`SandboxConfig::run_without_boundary`] is set (the
//! CLI's loudly named opt-out); then only the layers below remain, which are not a boundary.
//!
//! Layers applied inside (or, opted out, instead of) bubblewrap, each where the OS lets us
//! (which ones were is reported in [`Isolation`]):
//! - its own fresh temporary directory as cwd and `HOME`, an empty environment,
//!   `python3 -I -B` (no user site, no bytecode files);
//! - its own process group, killed with SIGKILL (every member, repeatedly until none is
//!   left) when the wall-clock timeout passes and again after it exits, so forked children
//!   do not outlive it;
//! - rlimits through `prlimit`: address space, CPU seconds, file size, processes;
//! - no network: `unshare -n` (a new, empty network namespace) when permitted;
//! - when running as root: the program runs as `nobody` (`setpriv`), so RLIMIT_NPROC
//!   applies and it cannot write where `nobody` may not;
//! - a Python audit hook installed before the program (it cannot be removed from Python)
//!   refuses to open files for writing, or to remove/rename/create paths, outside the
//!   sandbox directory, and refuses sockets. Python's documentation says an audit hook is no
//!   security boundary (`ctypes` or a child process walk around it): it only catches the
//!   plain mistakes early with a clear message.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::{ElmError, Result};

/// Limits of one run.
#[derive(Clone, Debug)]
pub struct SandboxConfig {
    /// The interpreter (looked up in PATH when relative).
    pub python: PathBuf,
    /// The bubblewrap executable (looked up in PATH when relative).
    pub bubblewrap: PathBuf,
    pub timeout: Duration,
    /// Address-space limit.
    pub memory_bytes: u64,
    /// CPU-time limit.
    pub cpu_seconds: u64,
    /// Largest file the program may write.
    pub file_bytes: u64,
    /// Processes of the sandbox user (applies when it is not root).
    pub max_processes: u64,
    /// Run generated code even where no bubblewrap boundary can be set up (rlimits, a network
    /// namespace where permitted and an audit hook only: the program can reach the user's
    /// files). Off by default; the CLI names it `--unsafe-run-code-without-sandbox`.
    pub run_without_boundary: bool,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            python: PathBuf::from("python3"),
            bubblewrap: PathBuf::from("bwrap"),
            timeout: Duration::from_secs(5),
            memory_bytes: 1 << 30,
            cpu_seconds: 10,
            file_bytes: 16 << 20,
            max_processes: 64,
            run_without_boundary: false,
        }
    }
}

/// Which isolation layers were applied.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Isolation {
    /// Inside bubblewrap: read-only root, private temp and home directories, every namespace
    /// unshared. False only when the user opted out of the boundary.
    pub bubblewrap: bool,
    pub network_namespace: bool,
    pub unprivileged_user: bool,
}

/// How a run ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Exit status 0.
    Passed,
    /// Non-zero exit or killed by a signal (e.g. an rlimit).
    Failed,
    /// Killed at the wall-clock timeout.
    TimedOut,
}

/// Result of one run.
#[derive(Clone, Debug, Serialize)]
pub struct RunOutcome {
    pub verdict: Verdict,
    pub exit_code: Option<i32>,
    pub seconds: f64,
    /// The last 2,000 bytes of stderr.
    pub stderr_tail: String,
}

/// Installed before the program runs; the program's own source follows as `__main__`.
const GUARD: &str = r#"
import os, sys
_root = os.path.realpath(os.getcwd())
def _inside(p):
    try:
        p = os.path.realpath(os.fsdecode(p) if not isinstance(p, int) else '/dev/fd')
    except Exception:
        return False
    return p == _root or p.startswith(_root + os.sep)
_WRITE_EVENTS = {'os.remove', 'os.rmdir', 'os.mkdir', 'os.rename', 'os.chmod', 'os.chown',
                 'os.link', 'os.symlink', 'os.truncate', 'os.utime', 'shutil.rmtree'}
def _hook(event, args):
    if event == 'open':
        path, mode, flags = args
        writes = (mode is not None and any(c in mode for c in 'wax+')) or \
                 (flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND))
        if writes and path is not None and not isinstance(path, int) and not _inside(path):
            raise PermissionError('sandbox: write outside the sandbox directory: %r' % (path,))
    elif event in _WRITE_EVENTS:
        for p in args[:2]:
            if isinstance(p, (str, bytes, os.PathLike)) and not _inside(p):
                raise PermissionError('sandbox: %s outside the sandbox directory' % event)
    elif event.startswith('socket.') and event != 'socket.getaddrinfo':
        raise PermissionError('sandbox: no network')
sys.addaudithook(_hook)
with open('program.py') as _f:
    _src = _f.read()
del _f
exec(compile(_src, 'program.py', 'exec'), {'__name__': '__main__'})
"#;

/// A fresh directory under the system temp dir.
fn fresh_dir() -> Result<PathBuf> {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let dir = std::env::temp_dir().join(format!("elm-sandbox-{}-{n}-{nanos}", std::process::id()));
    std::fs::create_dir(&dir).map_err(|e| ElmError::io(&dir, e))?;
    Ok(dir)
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

const NOBODY: u32 = 65534;

/// The interpreter and isolation layers this machine permits, probed once per configured
/// interpreter by running an empty program through the real launch path: the unprivileged
/// user may not reach a per-user interpreter (pyenv under /root), the system one is tried next.
fn launch_for(python: &Path, cfg: &SandboxConfig) -> Result<(PathBuf, Isolation)> {
    type Key = (PathBuf, PathBuf, bool);
    type Probed = Vec<(Key, (PathBuf, Isolation))>;
    static PROBED: OnceLock<std::sync::Mutex<Probed>> = OnceLock::new();
    let cache = PROBED.get_or_init(Default::default);
    let key: Key = (
        python.to_path_buf(),
        cfg.bubblewrap.clone(),
        cfg.run_without_boundary,
    );
    if let Some(hit) = cache
        .lock()
        .ok()
        .and_then(|c| c.iter().find(|(k, _)| *k == key).map(|(_, v)| v.clone()))
    {
        return Ok(hit);
    }
    let ok = |cmd: &mut Command| {
        cmd.stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let network_namespace = ok(Command::new("unshare").args(["-n", "true"]));
    let resolved = resolve_python(python);
    let mut interpreters = vec![];
    if is_root() {
        for p in [resolved.clone(), PathBuf::from("/usr/bin/python3")] {
            interpreters.push((p, true));
        }
    }
    // Bubblewrap hides every home directory, so a per-user interpreter is not reachable in it.
    interpreters.push((resolved.clone(), false));
    interpreters.push((PathBuf::from("/usr/bin/python3"), false));
    // Inside bubblewrap first; without it only when the user opted out of the boundary.
    let boundaries: &[bool] = if cfg.run_without_boundary {
        &[true, false]
    } else {
        &[true]
    };
    let candidates: Vec<(PathBuf, Isolation)> = boundaries
        .iter()
        .flat_map(|&bubblewrap| {
            interpreters.iter().map(move |(p, unprivileged_user)| {
                let iso = Isolation {
                    bubblewrap,
                    // bwrap unshares the network itself.
                    network_namespace: bubblewrap || network_namespace,
                    unprivileged_user: *unprivileged_user,
                };
                (p.clone(), iso)
            })
        })
        .collect();
    let mut chosen = None;
    for (p, iso) in candidates {
        let dir = fresh_dir()?;
        let probe = run_in(&dir, &p, &iso, "pass\n", cfg);
        let _ = std::fs::remove_dir_all(&dir);
        if probe.is_ok_and(|r| r.verdict == Verdict::Passed) {
            chosen = Some((p, iso));
            break;
        }
    }
    let chosen = chosen.ok_or_else(|| {
        ElmError::InvalidArgument(if cfg.run_without_boundary {
            format!(
                "sandbox: {} cannot run an empty program (is python3 installed?)",
                python.display()
            )
        } else {
            format!(
                "sandbox: generated code runs only inside bubblewrap, and `bwrap` cannot run \
                 {} with a read-only root and unshared namespaces here (install Debian's \
                 `bubblewrap`, and allow unprivileged user namespaces for a non-root user); \
                 `--unsafe-run-code-without-sandbox` runs it anyway, with access to your files",
                python.display()
            )
        })
    })?;
    if let Ok(mut c) = cache.lock() {
        c.push((key, chosen.clone()));
    }
    Ok(chosen)
}

fn setpriv_args() -> Vec<String> {
    vec![
        format!("--reuid={NOBODY}"),
        format!("--regid={NOBODY}"),
        "--clear-groups".into(),
        "--".into(),
    ]
}

/// Sends SIGKILL to every process of group `pgid` until none is left (bounded).
fn kill_group(pgid: u32) {
    let group = format!("-{pgid}");
    for _ in 0..50 {
        let alive = Command::new("kill")
            .args(["-0", "--", &group])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !alive {
            return;
        }
        let _ = Command::new("kill")
            .args(["-9", "--", &group])
            .stderr(Stdio::null())
            .status();
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `bwrap` and its options up to the program: the whole file system read-only, fresh /dev and
/// /proc (its own PID namespace), private tmpfs over the temp directories and every home
/// directory (nothing of the user's to read), only `dir` writable, no namespace shared (no
/// network), a new session (no terminal to inject into), killed when its parent dies.
fn bwrap_args(bwrap: &Path, dir: &Path) -> Vec<String> {
    let mut hidden: Vec<PathBuf> = ["/tmp", "/var/tmp", "/root", "/home", "/run/user"]
        .iter()
        .map(PathBuf::from)
        .collect();
    hidden.push(std::env::temp_dir());
    if let Some(home) = std::env::var_os("HOME").map(PathBuf::from) {
        // A home at / (some service users) cannot be hidden without hiding everything.
        if home.is_absolute() && home.parent().is_some() {
            hidden.push(home);
        }
    }
    let mut args: Vec<String> = vec![bwrap.display().to_string()];
    args.extend(
        ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
            .iter()
            .map(|s| s.to_string()),
    );
    hidden.sort();
    hidden.dedup();
    for h in hidden.iter().filter(|h| h.is_dir()) {
        // A directory under one already hidden is hidden with it (and may not exist there).
        if hidden.iter().any(|o| o != h && h.starts_with(o)) {
            continue;
        }
        args.extend(["--tmpfs".into(), h.display().to_string()]);
    }
    let d = dir.display().to_string();
    args.extend(
        [
            "--bind",
            &d,
            &d,
            "--chdir",
            &d,
            "--unshare-all",
            "--die-with-parent",
            "--new-session",
            "--",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    args
}

/// The interpreter as an absolute path (the unprivileged user may not search our PATH).
fn resolve_python(python: &Path) -> PathBuf {
    if python.components().count() > 1 {
        return python.to_path_buf();
    }
    Command::new(python)
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .ok()
        .and_then(|o| {
            let p = String::from_utf8_lossy(&o.stdout).trim().to_string();
            (!p.is_empty()).then(|| PathBuf::from(p))
        })
        .unwrap_or_else(|| python.to_path_buf())
}

/// The isolation `cfg` gets on this machine, probed once; an error where generated code would
/// run without the bubblewrap boundary and `cfg` does not opt out.
pub fn isolation(cfg: &SandboxConfig) -> Result<Isolation> {
    launch_for(&cfg.python, cfg).map(|(_, iso)| iso)
}

/// Runs `program` (Python source) under `cfg`; returns how it ended and what was isolated.
pub fn run_python(program: &str, cfg: &SandboxConfig) -> Result<(RunOutcome, Isolation)> {
    let (python, iso) = launch_for(&cfg.python, cfg)?;
    let dir = fresh_dir()?;
    let result = run_in(&dir, &python, &iso, program, cfg);
    let _ = std::fs::remove_dir_all(&dir);
    result.map(|o| (o, iso))
}

fn run_in(
    dir: &Path,
    python: &Path,
    iso: &Isolation,
    program: &str,
    cfg: &SandboxConfig,
) -> Result<RunOutcome> {
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).map_err(|e| ElmError::io(&p, e))
    };
    write("program.py", program)?;
    write("guard.py", GUARD)?;
    if iso.unprivileged_user {
        std::os::unix::fs::chown(dir, Some(NOBODY), Some(NOBODY))
            .map_err(|e| ElmError::io(dir, e))?;
    }
    let mut argv: Vec<String> = Vec::new();
    if iso.network_namespace && !iso.bubblewrap {
        argv.extend(["unshare".into(), "-n".into(), "--".into()]);
    }
    if iso.unprivileged_user {
        argv.push("setpriv".into());
        argv.extend(setpriv_args());
    }
    argv.extend([
        "prlimit".into(),
        format!("--as={}", cfg.memory_bytes),
        format!("--cpu={}", cfg.cpu_seconds),
        format!("--fsize={}", cfg.file_bytes),
        format!("--nproc={}", cfg.max_processes),
        "--".into(),
    ]);
    if iso.bubblewrap {
        argv.extend(bwrap_args(&cfg.bubblewrap, dir));
    }
    argv.extend([
        python.display().to_string(),
        "-I".into(),
        "-B".into(),
        "guard.py".into(),
    ]);
    // stderr goes to a file, not a pipe: nothing the program leaves behind can hold us up.
    let err_path = dir.join("stderr.txt");
    let err_file = std::fs::File::create(&err_path).map_err(|e| ElmError::io(&err_path, e))?;
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .current_dir(dir)
        .env_clear()
        .env("HOME", dir)
        .env("TMPDIR", dir)
        .env("PATH", "/usr/bin:/bin")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(err_file);
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let start = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|e| ElmError::io(Path::new(&argv[0]), e))?;
    let pgid = child.id();
    let mut timed_out = false;
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| ElmError::io(dir, e))? {
            break status;
        }
        if start.elapsed() >= cfg.timeout {
            timed_out = true;
            kill_group(pgid);
            break child.wait().map_err(|e| ElmError::io(dir, e))?;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    // Children it left behind (in its group) go too.
    kill_group(pgid);
    let seconds = start.elapsed().as_secs_f64();
    let mut err = Vec::new();
    if let Ok(f) = std::fs::File::open(&err_path) {
        let _ = f.take(1 << 20).read_to_end(&mut err);
    }
    let tail = &err[err.len().saturating_sub(2000)..];
    Ok(RunOutcome {
        verdict: if timed_out {
            Verdict::TimedOut
        } else if status.success() {
            Verdict::Passed
        } else {
            Verdict::Failed
        },
        exit_code: status.code(),
        seconds,
        stderr_tail: String::from_utf8_lossy(tail).into_owned(),
    })
}
