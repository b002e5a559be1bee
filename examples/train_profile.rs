//! Where one ELM training step spends its time: the teacher (dense layers `[0, l+M)`, no tape)
//! against the whole step (teacher + forward solve + taped backward + AdamW), per phase of the
//! λ schedule. `cargo run --release --example train_profile -- MODEL [STEPS] [BATCH] [SEQ]`
use std::time::Instant;

use elm::data::{
    batch_indices, load_gsm8k, make_batch, resolve_data_dir, tokenize_example, Example, Split,
};
use elm::equilibrium::module::ElmModule;
use elm::equilibrium::train::Trainer;
use elm::equilibrium::{ElmConfig, TrainConfig};
use elm::eval::gsm8k::chat_prompt;

fn main() -> elm::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let model = args
        .first()
        .cloned()
        .unwrap_or_else(|| elm::model::default_model_path().display().to_string());
    let arg = |i: usize, d: usize| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let (steps, batch, seq) = (arg(1, 6), arg(2, 2), arg(3, 128));
    let (dense, tok) = elm::model::load_pretrained(&model)?;
    let dir = resolve_data_dir(None)?;
    let t = Instant::now();
    let examples = load_gsm8k(&dir, Split::Train)?;
    let prompt = |q: &str| chat_prompt(&tok, q);
    let enc = |s: &str| tok.encode(s, false);
    let data: Vec<_> = examples
        .into_iter()
        .map(Example::Qa)
        .map(|e| tokenize_example(&e, seq, &prompt, "<|im_end|>\n", &enc))
        .collect::<elm::Result<_>>()?;
    println!(
        "tokenize {} examples: {:.2}s",
        data.len(),
        t.elapsed().as_secs_f64()
    );
    let ec = ElmConfig::new(12, 8);
    let module = ElmModule::init(&dense, &ec)?;
    for (phase, ce_start) in [("distill only (λ_ce = 0)", 1.0f32), ("CE + distill", 0.0)] {
        let mut cfg = TrainConfig {
            steps,
            batch_size: batch,
            seq_len: seq,
            checkpoint_every: 0,
            ..TrainConfig::default()
        };
        cfg.lambda.ce_start = ce_start;
        cfg.lambda.ce_end = ce_start;
        let mut tr = Trainer::new(&dense, ec.clone(), &module, cfg.clone(), model.clone())?;
        let pad = tok.eos_id().unwrap_or(0);
        let (mut teacher, mut total, mut tokens) = (0.0, 0.0, 0usize);
        for step in 0..steps {
            let idx = batch_indices(data.len(), batch, step, cfg.seed);
            let seqs: Vec<_> = idx.iter().map(|&i| &data[i]).collect();
            let b = make_batch(&seqs, pad);
            let t = Instant::now();
            let _ = tr.dense_targets(&b)?;
            teacher += t.elapsed().as_secs_f64();
            let t = Instant::now();
            let log = tr.train_step(&data, pad)?;
            total += t.elapsed().as_secs_f64();
            tokens += log.tokens;
        }
        println!(
            "{phase}: {:.3} s/step, teacher {:.3} s/step ({:.0}%), {:.1} tokens/s",
            total / steps as f64,
            teacher / steps as f64,
            100.0 * teacher / total,
            tokens as f64 / total
        );
    }
    Ok(())
}
