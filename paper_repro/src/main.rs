//! `paper_repro --scale smoke|small|paper [--only TABLE]... [--force]`: rebuilds the study's
//! tables (`OUT/README.md`, `OUT/tables.json`, plots under `OUT/plots/`), every expensive step
//! cached under `OUT/stages/` by a content key so that a killed run resumes and a rerun of
//! one table redoes nothing else.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    match paper_repro::study::run(paper_repro::study::Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
