//! The HumanEval sandbox: a passing and a failing program, an infinite loop and a fork bomb
//! killed within the timeout (with every child), writes outside its directory and network
//! refused; and the canonical solutions of the real problems pass while a wrong one fails.

mod common;

use std::time::{Duration, Instant};

use elm::eval::humaneval::{check_program, load_problems, problems_path, truncate_completion};
use elm::eval::sandbox::{run_python, SandboxConfig, Verdict};

fn cfg(secs: u64) -> SandboxConfig {
    SandboxConfig {
        timeout: Duration::from_secs(secs),
        ..SandboxConfig::default()
    }
}

#[test]
fn passing_and_failing_programs() {
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
    let start = Instant::now();
    let (r, _) = run_python("while True:\n    pass\n", &cfg(2)).unwrap();
    assert_eq!(r.verdict, Verdict::TimedOut);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn fork_bomb_and_its_children_are_killed() {
    // Every process records its pid, then forks forever; after the run none may be alive.
    let program = "import os, time\n\
                   while True:\n\
                   \x20   try:\n\
                   \x20       os.fork()\n\
                   \x20   except OSError:\n\
                   \x20       time.sleep(0.01)\n\
                   \x20   with open('pids', 'a') as f:\n\
                   \x20       f.write(str(os.getpid()) + '\\n')\n";
    // Run it via a wrapper that copies the pid list out before the sandbox dir is removed.
    let start = Instant::now();
    let (r, _) = run_python(
        &format!(
            "import os, sys, threading, time\n\
             src = {program:?}\n\
             if os.fork() == 0:\n\
             \x20   exec(src)\n\
             time.sleep(1.5)\n\
             sys.stderr.write('PIDS:' + ','.join(sorted(set(open('pids').read().split()))) + '\\n')\n\
             sys.stderr.flush()\n\
             while True:\n\
             \x20   pass\n"
        ),
        &cfg(3),
    )
    .unwrap();
    assert_eq!(r.verdict, Verdict::TimedOut, "{}", r.stderr_tail);
    assert!(
        start.elapsed() < Duration::from_secs(6),
        "{:?}",
        start.elapsed()
    );
    let pids: Vec<u32> = r
        .stderr_tail
        .lines()
        .find_map(|l| l.strip_prefix("PIDS:"))
        .unwrap_or_else(|| panic!("the bomb did not run: {}", r.stderr_tail))
        .split(',')
        .filter_map(|p| p.trim().parse().ok())
        .collect();
    assert!(pids.len() > 3, "the bomb forked: {pids:?}");
    std::thread::sleep(Duration::from_millis(200));
    for pid in pids {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        // Gone, or a zombie waiting for a reaper (not running code).
        assert!(
            status.is_empty() || status.contains("State:\tZ"),
            "pid {pid} still alive: {status}"
        );
    }
}

#[test]
fn writes_outside_the_sandbox_dir_and_network_are_refused() {
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
