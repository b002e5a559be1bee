//! (placeholder until its issue lands)
use crate::error::{ElmError, Result};

#[derive(clap::Args, Debug)]
pub struct CompressArgs {}
pub fn run_compress(_: CompressArgs) -> Result<()> {
    Err(ElmError::Unsupported("not implemented yet".into()))
}

#[derive(clap::Args, Debug)]
pub struct TrainArgs {}
pub fn run_train(_: TrainArgs) -> Result<()> {
    Err(ElmError::Unsupported("not implemented yet".into()))
}

#[derive(clap::Args, Debug)]
pub struct EvalArgs {}
pub fn run_eval(_: EvalArgs) -> Result<()> {
    Err(ElmError::Unsupported("not implemented yet".into()))
}
