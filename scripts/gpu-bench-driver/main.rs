// The throw-away driver crate of scripts/gpu-bench.sh (copied into its build directory): the
// library exposes the benchmark (elm::cuda::bench); this binary only parses arguments and prints
// the JSON report.
use elm::cuda::bench::{qwen25_1_5b_config, random_weights, run_bench, smollm2_135m_config, BenchSpec};

fn arg(args: &[String], name: &str) -> String {
    let i = args.iter().position(|a| a == name).unwrap_or_else(|| panic!("missing {name}"));
    args[i + 1].clone()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let model = arg(&args, "--model");
    let cfg = match model.as_str() {
        "smollm2-135m" => smollm2_135m_config(),
        "qwen2.5-1.5b" => qwen25_1_5b_config(),
        other => return Err(format!("unknown model {other}").into()),
    };
    let spec = BenchSpec {
        label: model.clone(),
        ordinal: arg(&args, "--ordinal").parse()?,
        prefill_len: arg(&args, "--prefill-len").parse()?,
        decode_prompt_len: arg(&args, "--decode-prompt-len").parse()?,
        decode_steps: arg(&args, "--steps").parse()?,
        decode_batches: arg(&args, "--batches")
            .split(',')
            .filter(|s| !s.is_empty())
            .map(str::parse)
            .collect::<Result<_, _>>()?,
        prefill_reps: arg(&args, "--reps").parse()?,
        tf32: arg(&args, "--tf32") == "1",
        seed: 0,
    };
    eprintln!("elm-gpu-bench: generating random {model} weights ...");
    let weights = random_weights(&cfg, 0);
    let report = run_bench(&weights, &spec)?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}
