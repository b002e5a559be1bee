//! The HumanEval sandbox: a passing and a failing program, an infinite loop and a fork bomb
//! killed within the timeout (with every child), writes outside its directory and network
//! refused; and the canonical solutions of the real problems pass while a wrong one fails.

mod common;

use std::time::{Duration, Instant};

use elm::eval::humaneval::{check_program, load_problems, problems_path, truncate_completion};
use elm::eval::sandbox::{isolation, run_python, SandboxConfig, Verdict};

// The sandbox tests run one at a time (`common::one_at_a_time`): a fork bomb fills the sandbox
// user's process limit, which every other sandboxed program of the same user shares while it
// lasts.

/// Whether generated code runs inside bubblewrap here; if not, the skip policy of
/// tests/common/skip.rs (a failure under CI or `ELM_REQUIRE_REAL_MODEL=1`, else a counted skip).
fn bwrap() -> bool {
    let iso = isolation(&cfg(5));
    let inside = iso.as_ref().is_ok_and(|i| i.bubblewrap);
    common::require(
        "bwrap",
        inside,
        format!("bubblewrap cannot run here (scripts/setup.sh installs it): {iso:?}"),
    )
}

fn cfg(secs: u64) -> SandboxConfig {
    SandboxConfig {
        timeout: Duration::from_secs(secs),
        ..SandboxConfig::default()
    }
}

#[test]
fn passing_and_failing_programs() {
    let _one = common::one_at_a_time();
    if !bwrap() {
        return;
    }
    let (ok, _) = run_python("assert 1 + 1 == 2\n", &cfg(5)).unwrap();
    assert_eq!(ok.verdict, Verdict::Passed, "{}", ok.stderr_tail);
    let (bad, _) = run_python("assert 1 + 1 == 3\n", &cfg(5)).unwrap();
    assert_eq!(bad.verdict, Verdict::Failed);
    assert!(
        bad.stderr_tail.contains("AssertionError"),
        "{}",
        bad.stderr_tail
    );
}

#[test]
fn infinite_loop_is_killed_at_the_timeout() {
    let _one = common::one_at_a_time();
    if !bwrap() {
        return;
    }
    let start = Instant::now();
    let (r, _) = run_python("while True:\n    pass\n", &cfg(2)).unwrap();
    assert_eq!(r.verdict, Verdict::TimedOut);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}

/// Host processes (not zombies) whose command line holds `tag`.
fn tagged_processes(tag: &str) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter(|e| {
            let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            let status = std::fs::read_to_string(e.path().join("status")).unwrap_or_default();
            String::from_utf8_lossy(&cmd).contains(tag) && !status.contains("State:\tZ")
        })
        .count()
}

#[test]
fn fork_bomb_and_its_children_are_killed() {
    let _one = common::one_at_a_time();
    if !bwrap() {
        return;
    }
    // A child interpreter whose command line carries a tag forks forever; the host's /proc is
    // watched while it runs (the bomb must have forked) and after (nothing tagged may live).
    let tag = format!("elm-bomb-{}", std::process::id());
    let bomb = "import os, time\n\
                while True:\n\
                \x20   try:\n\
                \x20       os.fork()\n\
                \x20   except OSError:\n\
                \x20       time.sleep(0.01)\n";
    let program = format!(
        "import subprocess, sys, time\n\
         subprocess.Popen([sys.executable, '-c', {bomb:?}, {tag:?}])\n\
         while True:\n\
         \x20   pass\n"
    );
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (done, tag) = (done.clone(), tag.clone());
        std::thread::spawn(move || {
            let mut most = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                most = most.max(tagged_processes(&tag));
                std::thread::sleep(Duration::from_millis(50));
            }
            most
        })
    };
    let start = Instant::now();
    let (r, _) = run_python(&program, &cfg(3)).unwrap();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let most = watcher.join().unwrap();
    assert_eq!(r.verdict, Verdict::TimedOut, "{}", r.stderr_tail);
    assert!(
        start.elapsed() < Duration::from_secs(6),
        "{:?}",
        start.elapsed()
    );
    assert!(most > 3, "the bomb forked: at most {most} processes seen");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(tagged_processes(&tag), 0, "bomb processes outlived the run");
}

#[test]
fn writes_outside_the_sandbox_dir_and_network_are_refused() {
    let _one = common::one_at_a_time();
    if !bwrap() {
        return;
    }
    let target = std::env::temp_dir().join(format!("elm-escape-{}", std::process::id()));
    let program = format!(
        "open('inside.txt', 'w').write('ok')\n\
         try:\n\
         \x20   open({t:?}, 'w').write('escaped')\n\
         \x20   raise SystemExit('wrote outside')\n\
         except PermissionError:\n\
         \x20   pass\n\
         import os\n\
         try:\n\
         \x20   os.mkdir({t:?} + '.d')\n\
         \x20   raise SystemExit('mkdir outside')\n\
         except PermissionError:\n\
         \x20   pass\n\
         import socket\n\
         try:\n\
         \x20   socket.create_connection(('1.1.1.1', 80), timeout=1)\n\
         \x20   raise SystemExit('network reachable')\n\
         except OSError:\n\
         \x20   pass\n",
        t = target.display().to_string()
    );
    let (r, iso) = run_python(&program, &cfg(5)).unwrap();
    assert_eq!(r.verdict, Verdict::Passed, "{}", r.stderr_tail);
    assert!(!target.exists(), "the program wrote {}", target.display());
    eprintln!("isolation on this machine: {iso:?}");
    if iso.unprivileged_user {
        let (r, _) = run_python("import os\nassert os.getuid() == 65534\n", &cfg(5)).unwrap();
        assert_eq!(r.verdict, Verdict::Passed, "{}", r.stderr_tail);
    }
}

#[test]
fn canonical_solutions_pass_and_a_wrong_one_fails() {
    let _one = common::one_at_a_time();
    if !bwrap() {
        return;
    }
    let Some(path) = common::fetched_file(
        problems_path(&elm::data::default_data_dir()),
        "HumanEval problems",
    ) else {
        return;
    };
    let problems = load_problems(&path).unwrap();
    assert_eq!(problems.len(), 164);
    for p in problems.iter().step_by(40) {
        let (r, _) = run_python(&check_program(p, &p.canonical_solution), &cfg(5)).unwrap();
        assert_eq!(
            r.verdict,
            Verdict::Passed,
            "{}: {}",
            p.task_id,
            r.stderr_tail
        );
    }
    let p = &problems[0];
    let (r, _) = run_python(&check_program(p, "    return False\n"), &cfg(5)).unwrap();
    assert_eq!(r.verdict, Verdict::Failed);
    assert_eq!(
        truncate_completion("    return 1\n\ndef other():\n    pass"),
        "    return 1\n"
    );
    assert_eq!(truncate_completion("    x = 1\nprint(x)"), "    x = 1");
}

/// Programs that walk around Python's audit hook (a child shell, `subprocess`, libc through
/// `ctypes`, paths through /proc) try to write into the host's temp directory and into the
/// repository, to read a file in the user's home, and to reach a TCP port this test listens on.
/// Inside bubblewrap every attempt stays inside: the host file system is checked afterwards.
#[test]
fn escapes_around_the_audit_hook_are_contained() {
    let _one = common::one_at_a_time();
    if !bwrap() {
        return;
    }
    use std::io::Write;
    let (_, iso) = run_python("pass\n", &cfg(5)).unwrap();
    assert!(iso.bubblewrap, "{iso:?}");
    let tag = format!("{}-{:?}", std::process::id(), std::thread::current().id())
        .replace(|c: char| !c.is_ascii_alphanumeric(), "");
    let tmp = std::env::temp_dir();
    let repo = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target");
    let targets: Vec<std::path::PathBuf> =
        ["system", "subprocess", "ctypes", "procfd", "repo", "fork"]
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let base = if *name == "repo" { &repo } else { &tmp };
                base.join(format!("elm-escape-{tag}-{i}-{name}"))
            })
            .collect();
    let home = std::env::var_os("HOME")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| tmp.clone());
    let secret = format!("elm-sandbox-secret-{tag}");
    let secret_file = home.join(format!(".elm-sandbox-secret-{tag}"));
    std::fs::write(&secret_file, &secret).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let t: Vec<String> = targets.iter().map(|p| p.display().to_string()).collect();
    let program = format!(
        r#"import os, subprocess, ctypes, sys
def attempt(what, f):
    try:
        f()
    except Exception as e:
        sys.stderr.write('%s refused: %r\n' % (what, e))
attempt('system', lambda: os.system('echo escaped > {t0}'))
attempt('subprocess', lambda: subprocess.run(['sh', '-c', 'echo escaped > {t1}']))
def libc_write():
    libc = ctypes.CDLL(None)
    fd = libc.open({t2:?}.encode(), os.O_WRONLY | os.O_CREAT, 0o644)
    if fd >= 0:
        libc.write(fd, b'escaped', 7)
        libc.close(fd)
attempt('ctypes', libc_write)
attempt('procfd', lambda: subprocess.run(['sh', '-c',
    'for d in /proc/self/cwd/.. /proc/1/cwd/.. /proc/1/root{tmpdir}; do echo escaped > $d/{b3}; done']))
attempt('repo', lambda: subprocess.run(['sh', '-c', 'echo escaped > {t4}']))
attempt('fork', lambda: subprocess.run(['sh', '-c', '(sleep 0.2; echo escaped > {t5}) & exit 0']))
attempt('home', lambda: sys.stderr.write('HOME READ: ' + subprocess.run(['cat', {secret_file:?}],
    capture_output=True, text=True).stdout + '\n'))
attempt('network', lambda: subprocess.run(['bash', '-c', 'echo hi > /dev/tcp/127.0.0.1/{port}']))
"#,
        t0 = t[0],
        t1 = t[1],
        t2 = t[2],
        tmpdir = tmp.display(),
        b3 = targets[3].file_name().unwrap().to_string_lossy(),
        t4 = t[4],
        t5 = t[5],
        secret_file = secret_file.display().to_string(),
    );
    let (r, _) = run_python(&program, &cfg(10)).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let _ = std::fs::remove_file(&secret_file);
    let mut escaped = vec![];
    for p in &targets {
        if p.exists() {
            escaped.push(p.display().to_string());
            let _ = std::fs::remove_file(p);
        }
    }
    assert!(
        escaped.is_empty(),
        "escaped: {escaped:?}\n{}",
        r.stderr_tail
    );
    assert!(
        !r.stderr_tail.contains(&secret),
        "the program read the user's home: {}",
        r.stderr_tail
    );
    assert!(
        r.stderr_tail.contains("HOME READ"),
        "the home probe did not run: {}",
        r.stderr_tail
    );
    let mut connected = listener.accept().is_ok();
    if let Ok((mut s, _)) = listener.accept() {
        connected = true;
        let _ = s.write_all(b"");
    }
    assert!(!connected, "the program reached 127.0.0.1:{port}");
    assert_eq!(r.verdict, Verdict::Passed, "{}", r.stderr_tail);
}

/// Where bubblewrap cannot run, the sandbox refuses (naming the opt-out) instead of running
/// generated code unconfined; with the opt-out it runs with the remaining layers and says so.
#[test]
fn no_bubblewrap_is_refused_unless_the_user_opts_out() {
    let _one = common::one_at_a_time();
    let missing = SandboxConfig {
        bubblewrap: "/nonexistent/bwrap".into(),
        ..cfg(5)
    };
    let err = run_python("pass\n", &missing).unwrap_err().to_string();
    assert!(err.contains("bubblewrap"), "{err}");
    assert!(err.contains("--unsafe-run-code-without-sandbox"), "{err}");
    let opted_out = SandboxConfig {
        run_without_boundary: true,
        ..missing
    };
    let (r, iso) = run_python("pass\n", &opted_out).unwrap();
    assert_eq!(r.verdict, Verdict::Passed, "{}", r.stderr_tail);
    assert!(!iso.bubblewrap);
}
