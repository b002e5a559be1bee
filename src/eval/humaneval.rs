//! HumanEval (164 Python problems, openai/human-eval, MIT): greedy pass@1 and the
//! teacher-forced NLL of each canonical solution given its prompt.
//!
//! Prompting is completion-style, as in the HumanEval paper: the model continues the raw
//! prompt (signature + docstring, no chat template) and the completion is cut at the first
//! of [`STOP_SEQUENCES`] (a new top-level statement). The program `prompt + completion +
//! "\n" + test + "\ncheck(entry_point)\n"` runs in [`super::sandbox`], never in this process.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::equilibrium::infer::{ElmModel, InferenceConfig};
use crate::error::{ElmError, Result};
use crate::formats::tokenizer::Tokenizer;

use super::gsm8k::{generate_in_batches, GenerationLimits, GenerationRun};
use super::nll::{teacher_forced_nll, NllRun, ScoredSequence};
use super::sandbox::{
    isolation as sandbox_isolation, run_python, Isolation, SandboxConfig, Verdict,
};
use super::stats::ItemScore;

/// Where a completion ends (the HumanEval paper's stop sequences).
pub const STOP_SEQUENCES: [&str; 5] = ["\nclass", "\ndef", "\n#", "\nif", "\nprint"];

/// One problem of `HumanEval.jsonl`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Problem {
    pub task_id: String,
    pub prompt: String,
    pub canonical_solution: String,
    pub test: String,
    pub entry_point: String,
}

/// `<data_dir>/humaneval/HumanEval.jsonl` (written by `scripts/fetch-humaneval.sh`).
pub fn problems_path(data_dir: &Path) -> PathBuf {
    data_dir.join("humaneval").join("HumanEval.jsonl")
}

/// Loads and checks the problems (every field non-empty, ids unique).
pub fn load_problems(path: &Path) -> Result<Vec<Problem>> {
    let raw = std::fs::read_to_string(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            ElmError::format(
                path,
                "missing: run `bash scripts/fetch-humaneval.sh` (or scripts/setup.sh)",
            )
        } else {
            ElmError::io(path, e)
        }
    })?;
    let mut out: Vec<Problem> = Vec::new();
    for (i, line) in raw.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let p: Problem = serde_json::from_str(line)
            .map_err(|e| ElmError::format(path, format!("line {}: {e}", i + 1)))?;
        let empty = [
            ("task_id", &p.task_id),
            ("prompt", &p.prompt),
            ("canonical_solution", &p.canonical_solution),
            ("test", &p.test),
            ("entry_point", &p.entry_point),
        ]
        .into_iter()
        .find(|(_, v)| v.trim().is_empty());
        if let Some((field, _)) = empty {
            return Err(ElmError::format(
                path,
                format!("line {}: field `{field}` is empty", i + 1),
            ));
        }
        if out.iter().any(|q| q.task_id == p.task_id) {
            return Err(ElmError::format(
                path,
                format!("line {}: duplicate task_id {}", i + 1, p.task_id),
            ));
        }
        out.push(p);
    }
    if out.is_empty() {
        return Err(ElmError::format(path, "no problems"));
    }
    Ok(out)
}

/// The completion up to the first stop sequence.
pub fn truncate_completion(text: &str) -> &str {
    let end = STOP_SEQUENCES
        .iter()
        .filter_map(|s| text.find(s))
        .min()
        .unwrap_or(text.len());
    &text[..end]
}

/// The program that checks `completion` against the problem's tests.
pub fn check_program(p: &Problem, completion: &str) -> String {
    format!(
        "{}{}\n\n{}\n\ncheck({})\n",
        p.prompt, completion, p.test, p.entry_point
    )
}

/// HumanEval settings.
#[derive(Clone, Debug)]
pub struct HumanEvalOptions {
    pub batch: usize,
    pub max_new_tokens: usize,
    pub inference: InferenceConfig,
    /// Wall-clock limit per program, seconds.
    pub timeout_s: f64,
    /// See [`SandboxConfig::run_without_boundary`].
    pub run_without_sandbox: bool,
}

/// One evaluated problem.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HumanEvalSample {
    pub task_id: String,
    pub completion: String,
    pub verdict: Verdict,
    pub seconds: f64,
    pub stderr_tail: String,
}

/// pass@1 results.
#[derive(Clone, Debug, Serialize)]
pub struct HumanEvalResult {
    /// `value` 1 when the problem's tests pass, weight 1.
    pub items: Vec<ItemScore>,
    pub samples: Vec<HumanEvalSample>,
    #[serde(flatten)]
    pub run: GenerationRun,
    pub isolation: Option<Isolation>,
}

/// Greedy completion of every problem, then its tests in the sandbox.
pub fn eval_humaneval(
    model: &ElmModel,
    tok: &Tokenizer,
    problems: &[Problem],
    opts: &HumanEvalOptions,
    mut on_progress: impl FnMut(usize) + Send,
) -> Result<HumanEvalResult> {
    if opts.batch == 0 || !opts.timeout_s.is_finite() || opts.timeout_s <= 0.0 {
        return Err(ElmError::config(
            "humaneval",
            "batch must be >= 1 and timeout > 0",
        ));
    }
    let sandbox = SandboxConfig {
        timeout: Duration::from_secs_f64(opts.timeout_s),
        run_without_boundary: opts.run_without_sandbox,
        ..SandboxConfig::default()
    };
    // Refused before any token is generated where no sandbox can hold the code.
    let isolation = Some(sandbox_isolation(&sandbox)?);
    let (mut samples, mut items) = (vec![], vec![]);
    let totals = generate_in_batches(
        model,
        tok,
        &opts.inference,
        problems,
        // Generation stops at the first stop sequence: the completion is cut there anyway.
        GenerationLimits {
            batch: opts.batch,
            max_new_tokens: opts.max_new_tokens,
            stop_strings: &STOP_SEQUENCES,
        },
        |p| tok.encode(&p.prompt, false),
        |p, text, _cut| {
            let completion = truncate_completion(&text).to_string();
            let (run, _) = run_python(&check_program(p, &completion), &sandbox)?;
            items.push(ItemScore {
                id: p.task_id.clone(),
                value: f64::from(u8::from(run.verdict == Verdict::Passed)),
                weight: 1.0,
            });
            samples.push(HumanEvalSample {
                task_id: p.task_id.clone(),
                completion,
                verdict: run.verdict,
                seconds: run.seconds,
                stderr_tail: run.stderr_tail,
            });
            Ok(())
        },
        &mut on_progress,
    )?;
    Ok(HumanEvalResult {
        items,
        samples,
        run: totals.run,
        isolation,
    })
}

/// Teacher-forced NLL per token of each canonical solution given its prompt, split as
/// lm-evaluation-harness splits it (prompt and solution encoded together; the prompt's
/// closing newline belongs to the solution's first token, as in the file).
pub fn solution_nll(
    model: &ElmModel,
    tok: &Tokenizer,
    problems: &[Problem],
    inference: &InferenceConfig,
    batch: usize,
    on_progress: impl FnMut(usize) + Send,
) -> Result<NllRun> {
    let seqs = problems
        .iter()
        .map(|p| {
            ScoredSequence::from_text(
                p.task_id.clone(),
                &p.prompt,
                &p.canonical_solution,
                &|t: &str| tok.encode(t, false),
            )
        })
        .collect::<Result<Vec<_>>>()?;
    teacher_forced_nll(model, inference, &seqs, batch, on_progress)
}
