//! `elm::eval::task`: every evaluation task round-trips through its name (`FromStr`, `Display`)
//! and its JSON form, iterating the library's one list (`Task::ALL`) so a new task is covered
//! without touching this file.

use elm::eval::Task;
use elm::registry::Registry;

#[test]
fn every_task_round_trips_through_its_name_and_json() {
    assert!(!Task::ALL.is_empty());
    for task in Task::ALL {
        let name = task.name();
        assert_eq!(name.parse::<Task>().unwrap(), task, "{name}");
        assert_eq!(task.to_string(), name);
        assert_eq!(Task::from_name(name), Some(task));
        // The JSON spelling (serde kebab-case: `human-eval`, `human-eval-nll`) is not the CLI
        // name for the HumanEval tasks; reports written so far use it, so it stays.
        let json = serde_json::to_string(&task).unwrap();
        assert_eq!(serde_json::from_str::<Task>(&json).unwrap(), task, "{json}");
    }
    let names = Task::names();
    let unique: std::collections::BTreeSet<_> = names.iter().collect();
    assert_eq!(unique.len(), names.len(), "task names are unique");
    let e = "nope".parse::<Task>().unwrap_err().to_string();
    assert!(
        e.contains("`nope`: expected gsm8k-nll, gsm8k, humaneval or humaneval-nll"),
        "{e}"
    );
}

/// `elm eval --help` lists the library's tasks (the binary keeps no copy of the names), and a
/// wrong `--task` gets the library's message.
#[test]
fn cli_reads_the_library_task_list() {
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_elm"))
            .args(args)
            .output()
            .expect("run elm")
    };
    let help = String::from_utf8_lossy(&run(&["eval", "--help"]).stdout).to_string();
    let listed = format!("[possible values: {}]", Task::names().join(", "));
    assert!(help.contains(&listed), "{help}");
    let out = run(&["eval", "--model", "m.gguf", "--task", "nope"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("expected gsm8k-nll, gsm8k"), "{err}");
}
