//! `paper_repro`: rebuilds the study's tables and plots in one command (see `main.rs` and
//! `results/README.md`). It orchestrates the `elm` command line (every step is an
//! `elm ... --json` call, cached as a stage) and owns no algorithm: training, evaluation,
//! pruning, solvers, paired statistics and the spectral estimate are the library's.

pub mod bench;
pub mod curves;
pub mod elm_cli;
pub mod error;
pub mod markdown;
pub mod paper;
pub mod report;
pub mod runs;
pub mod scale;
pub mod solvers;
pub mod stage;
pub mod study;
pub mod tables;
