//! (placeholder until its issue lands)
use crate::error::{ElmError, Result};

#[derive(clap::Args, Debug)]
pub struct SolveArgs {}
pub fn run_solve(_: SolveArgs) -> Result<()> {
    Err(ElmError::Unsupported("not implemented yet".into()))
}

#[derive(clap::Args, Debug)]
pub struct StudyArgs {}
pub fn run_study(_: StudyArgs) -> Result<()> {
    Err(ElmError::Unsupported("not implemented yet".into()))
}
