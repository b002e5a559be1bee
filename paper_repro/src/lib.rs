//! `paper_repro`: rebuilds the study's tables and plots in one command (see `main.rs` and
//! `results/README.md`). It orchestrates the `elm` command line (every step is an
//! `elm ... --json` call, cached as a stage) and owns no algorithm: training, evaluation,
//! pruning, solvers, paired statistics and the spectral estimate are the library's.
//!
//! Layout: the files form an acyclic import graph (no two files import each other, directly
//! or around a loop). In the order below each file imports only files listed before it, from
//! plain data up to the command:
//!
//! 1. Foundations: [`error`]; [`scale`] (the budgets and limits of each scale); [`paper`] (what
//!    the paper reports, quoted beside each table); [`rows`] (the typed rows of every table,
//!    plain data); [`elm_cli`] (runs `elm ... --json` and decodes it); [`stage`] (the
//!    content-keyed, resumable stage cache); [`markdown`] (the Markdown table and the cell
//!    formats, over [`rows`]'s intervals).
//! 2. The study's steps as stages: [`runs`] (train, evaluate, prune, heal, measure), [`bench`]
//!    (`elm bench`), [`solvers`] (table 7a's canonical problems).
//! 3. [`tables`]: `Tables`, every table of one run, as `OUT/tables.json` stores it.
//! 4. Filling the rows from the stages: [`fill_tables`] (tables 1–7), [`fill_curves`] (tables 8
//!    and 9, which start from [`fill_tables`]'s dense runs and table 1), [`fill_grid`] (table
//!    11, the train-K × test-K grid). They return rows and never see `Tables`.
//! 5. Writing a `Tables`: [`table_markdown`] (each table as Markdown, from its rows), [`plots`]
//!    (the SVG plots), [`claims`] (the tables that read several runs: the paper's claims and
//!    the two families), [`readme`] (`OUT/README.md` and the blocks `--readme` writes into the
//!    repository's README).
//! 6. [`study`]: the command (`--scale`, `--only`) that plans the stages, fills a `Tables` and
//!    writes it.

pub mod bench;
pub mod claims;
pub mod elm_cli;
pub mod error;
pub mod fill_curves;
pub mod fill_grid;
pub mod fill_tables;
pub mod markdown;
pub mod paper;
pub mod plots;
pub mod readme;
pub mod rows;
pub mod runs;
pub mod scale;
pub mod solvers;
pub mod stage;
pub mod study;
pub mod table_markdown;
pub mod tables;
