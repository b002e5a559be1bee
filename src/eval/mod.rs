//! Evaluation of every model variant through one path ([`task::run_task`]): GSM8K answer
//! NLL and exact match (harness extraction rules), HumanEval pass@1 (sandboxed) and solution
//! NLL, each figure with a seeded bootstrap interval and paired differences ([`stats`]).

pub mod answer;
pub mod gsm8k;
pub mod humaneval;
pub mod nll;
pub mod sandbox;
pub mod solver_summary;
pub mod stats;
pub mod task;

pub use answer::{exact_match, flexible_extract, score_response, strict_extract};
pub use gsm8k::{answer_nll, eval_gsm8k, Gsm8kOptions, Gsm8kResult};
pub use nll::{teacher_forced_nll, NllRun, ScoredSequence};
pub use solver_summary::SolverSummary;
pub use stats::{estimate, paired, BootstrapConfig, Estimate, ItemScore, PairedComparison};
pub use task::{run_task, Task, TaskData, TaskOptions, TaskRun};
