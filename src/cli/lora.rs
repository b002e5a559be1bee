//! `elm lora` (stage 1): LoRA SFT of the dense model, merged with α/r into a tuned dense model
//! directory that every compressed model is cut from.

use std::path::{Path, PathBuf};

use elm::data::{training_sequences, validation_problems, TokenSequence};
use elm::error::{ElmError, Result};
use elm::formats::save_hf_model;
use elm::formats::tokenizer::Tokenizer;
use elm::io::{write_json_atomic, RunStart};
use elm::lora::sft::LORA_STATE_FILE;
use elm::lora::{answer_nll_mean, ce_ends, LoraConfig, LoraEvent, LoraReport, LoraTrainer};

use super::output::{bar, print_json};

/// Training sequences (see [`elm::data::training_sequences`]), saying how many were dropped.
pub(crate) fn train_data(
    tok: &Tokenizer,
    data: Option<&Path>,
    data_dir: Option<&Path>,
    seq_len: usize,
) -> Result<Vec<TokenSequence>> {
    let (seqs, dropped) = training_sequences(tok, data, data_dir, seq_len)?;
    if dropped > 0 {
        say_err!(
            "note: {dropped} of {} training sequences have no answer token within {seq_len} tokens; dropped",
            seqs.len() + dropped
        );
    }
    Ok(seqs)
}

#[derive(clap::Args, Debug)]
pub struct LoraArgs {
    /// Dense model: a .gguf file or an HF directory.
    #[arg(long)]
    pub model: PathBuf,
    /// LoraConfig JSON (unknown keys rejected).
    #[arg(long)]
    pub config: Option<PathBuf>,
    #[arg(long)]
    pub steps: Option<usize>,
    #[arg(long)]
    pub seq_len: Option<usize>,
    /// Run directory (resumable checkpoint, lora_report.json); the merged model goes to
    /// OUT/model (an HF directory `elm` and `elm eval` read).
    #[arg(long)]
    pub out: PathBuf,
    #[command(flatten)]
    pub run: super::output::RunFlags,
    #[command(flatten)]
    pub source: super::output::DataFlags,
    /// Held-out GSM8K validation problems (the end of train.jsonl, never trained on) for the
    /// answer NLL before/after (0 = skip).
    #[arg(long, default_value_t = 32)]
    pub eval_examples: usize,
    #[arg(long)]
    pub json: bool,
}

/// `elm lora`: LoRA SFT, merge with α/r, save the tuned dense model, answer NLL before/after.
pub fn run_lora(a: LoraArgs) -> Result<()> {
    if a.run.resume && (a.config.is_some() || a.steps.is_some() || a.seq_len.is_some()) {
        return Err(ElmError::config(
            "resume",
            "--resume continues the saved run as configured: drop --config/--steps/--seq-len",
        ));
    }
    let super::output::OpenedRun {
        run,
        start,
        dense,
        tok,
    } = super::output::open_run::<LoraConfig>(
        &a.out,
        &a.run,
        ("lora", LORA_STATE_FILE, "run"),
        &a.model,
    )?;
    // A fresh run's request, written once everything is checked, before its first save.
    let mut request = None;
    let mut trainer = match start {
        RunStart::Resume => LoraTrainer::resume(&dense, &a.out)?,
        // Stopped before its starting point was saved: nothing was trained, so the run starts
        // again as it was requested.
        RunStart::Restart { request: cfg, .. } => {
            LoraTrainer::new(&dense, cfg, a.model.display().to_string())?
        }
        RunStart::Fresh => {
            let mut cfg = match &a.config {
                Some(p) => LoraConfig::from_file(p)?,
                None => LoraConfig::default(),
            };
            if let Some(s) = a.steps {
                cfg.steps = s;
            }
            if let Some(s) = a.seq_len {
                cfg.seq_len = s;
            }
            let trainer = LoraTrainer::new(&dense, cfg.clone(), a.model.display().to_string())?;
            request = Some(cfg);
            trainer
        }
    };
    let data = train_data(
        &tok,
        a.source.data.as_deref(),
        a.source.data_dir.as_deref(),
        trainer.cfg.seq_len,
    )?;
    let pad = tok.eos_id().unwrap_or(0);
    let memory = super::elm_cmds::training_memory("lora", &a.model, &dense, &trainer, &data, pad)?;
    // After training: the merged copy of the model beside the trainer's, and its tensors'
    // bytes twice while `save_hf_model` writes them (one copy per tensor, one serialised).
    let model_bytes = 4 * dense.num_params() as u64;
    let memory = memory.with_phase(
        "merging",
        &[
            ("merged model", model_bytes),
            ("its bytes while written", 2 * model_bytes),
        ],
    );
    super::output::check_memory(&memory, a.json)?;
    let test = validation_problems(a.source.data_dir.as_deref(), a.eval_examples)?;
    let before = if test.is_empty() {
        None
    } else {
        Some(answer_nll_mean(&dense, &tok, &test, 4)?)
    };
    let b = bar(trainer.cfg.steps, trainer.step);
    if let Some(req) = &request {
        run.write_request("lora", &dense.config, req)?;
    }
    let seconds = trainer.run(&data, pad, &a.out, |ev| {
        if let LoraEvent::Step(l) = ev {
            b.set_message(format!(
                "ce {:.4} lr {:.2e} |g| {:.3}",
                l.ce, l.lr, l.grad_norm
            ));
            b.inc(1);
        }
    })?;
    b.finish_and_clear();
    let merged = trainer.merged()?;
    let model_dir = a.out.join("model");
    save_hf_model(&merged, &model_dir)?;
    tok.save_dir(&model_dir)?;
    let after = if test.is_empty() {
        None
    } else {
        Some(answer_nll_mean(&merged, &tok, &test, 4)?)
    };
    let (first, last) = ce_ends(&trainer.history, 10);
    let report = LoraReport {
        steps: trainer.step,
        seconds,
        seconds_all_runs: trainer.history.iter().map(|s| s.seconds).sum(),
        train_sequences: data.len(),
        train_ce_first: first,
        train_ce_last: last,
        held_out_examples: test.len(),
        answer_nll_before: before,
        answer_nll_after: after,
        out: model_dir.display().to_string(),
    };
    write_json_atomic(&a.out.join("lora_report.json"), &report)?;
    if a.json {
        let mut v = super::output::to_json(&report)?;
        v["memory_estimate"] = super::output::to_json(&memory)?;
        v["peak_rss_bytes"] = elm::io::peak_rss_bytes().into();
        print_json(&v)?;
    } else {
        say!(
            "LoRA SFT {} steps ({seconds:.0}s): train CE {first:.4} -> {last:.4}; merged model -> {}",
            report.steps,
            model_dir.display()
        );
        if let (Some(b), Some(f)) = (before, after) {
            say!(
                "held-out answer NLL ({} GSM8K validation problems): {b:.4} -> {f:.4} nats/token",
                test.len()
            );
        }
    }
    Ok(())
}
