//! (placeholder until its issue lands)
use crate::error::{ElmError, Result};

#[derive(clap::Args, Debug)]
pub struct FetchArgs {}
pub fn run_fetch(_: FetchArgs) -> Result<()> {
    Err(ElmError::Unsupported("not implemented yet".into()))
}

#[derive(clap::Args, Debug)]
pub struct GenerateArgs {}
pub fn run_generate(_: GenerateArgs) -> Result<()> {
    Err(ElmError::Unsupported("not implemented yet".into()))
}

#[derive(clap::Args, Debug)]
pub struct LogitsArgs {}
pub fn run_logits(_: LogitsArgs) -> Result<()> {
    Err(ElmError::Unsupported("not implemented yet".into()))
}

#[derive(clap::Args, Debug)]
pub struct PerplexityArgs {}
pub fn run_perplexity(_: PerplexityArgs) -> Result<()> {
    Err(ElmError::Unsupported("not implemented yet".into()))
}

#[derive(clap::Args, Debug)]
pub struct BenchArgs {}
pub fn run_bench(_: BenchArgs) -> Result<()> {
    Err(ElmError::Unsupported("not implemented yet".into()))
}
