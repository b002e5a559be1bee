//! Teacher-forced NLL: the batched path against a float64 numpy forward of a tiny HF Llama
//! (fixture from tests/fixtures/gen/ref_eval_nll.py), and batched == one sequence at a time for the dense
//! model and for an ELM with adaptive Anderson stopping (padding must not reach a real token,
//! nor a row's fixed-point solve).

mod common;

use elm::equilibrium::infer::{ElmModel, ElmSession, InferenceConfig, KvMode};
use elm::equilibrium::{ElmConfig, ElmModule};
use elm::eval::nll::{teacher_forced_nll, token_nll, ScoredSequence};
use elm::model::{load_weights, Arch, ModelConfig, ModelWeights};
use elm::solver::{SolverConfig, StopCriteria};
use rand::{rngs::StdRng, Rng, SeedableRng};

fn fixture() -> (ElmModel, Vec<ScoredSequence>, Vec<(f64, usize)>) {
    let root = env!("CARGO_MANIFEST_DIR");
    let f: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{root}/tests/fixtures/eval/nll_ref.json")).unwrap(),
    )
    .unwrap();
    let weights = load_weights(format!("{root}/tests/fixtures/io/hf_tiny_llama")).unwrap();
    let mut seqs = vec![];
    let mut want = vec![];
    for it in f["items"].as_array().unwrap() {
        let tokens: Vec<u32> = serde_json::from_value(it["tokens"].clone()).unwrap();
        let first = it["first_scored"].as_u64().unwrap() as usize;
        seqs.push(ScoredSequence {
            id: it["id"].as_str().unwrap().into(),
            tokens,
            first_scored: first,
        });
        want.push((
            it["nll_sum"].as_f64().unwrap(),
            it["count"].as_u64().unwrap() as usize,
        ));
    }
    (ElmModel::dense(weights), seqs, want)
}

#[test]
fn batched_nll_matches_numpy_reference() {
    let (model, seqs, want) = fixture();
    for batch in [1, 3, 8] {
        let run =
            teacher_forced_nll(&model, &InferenceConfig::default(), &seqs, batch, |_| {}).unwrap();
        assert_eq!(run.items.len(), seqs.len());
        for (item, (nll, count)) in run.items.iter().zip(&want) {
            assert_eq!(item.weight as usize, *count);
            assert!(
                (item.value - nll).abs() < 1e-4 * count.max(&1).to_owned() as f64,
                "batch {batch} item {}: {} vs numpy {nll}",
                item.id,
                item.value
            );
        }
        assert_eq!(run.scored_tokens, want.iter().map(|w| w.1).sum::<usize>());
        assert!(run.tok_s > 0.0);
    }
}

fn elm_model() -> ElmModel {
    let mut cfg = ModelConfig::tiny(Arch::Llama);
    cfg.num_layers = 5;
    let w = ModelWeights::random(&cfg, 11);
    // A large W_z: the map is far from constant in z, so the iterates after a few steps
    // depend on the solver's history (the paper's 0.1 converges in ~2 steps whatever it sees).
    let ec = ElmConfig {
        wz_scale: 3.0,
        ..ElmConfig::new(1, 3)
    };
    let module = ElmModule::init(&w, &ec).unwrap();
    ElmModel::new(w, ec, module).unwrap()
}

fn random_seqs(vocab: usize) -> Vec<ScoredSequence> {
    let mut rng = StdRng::seed_from_u64(4);
    // Two of the same length (one fixed-point group), the rest distinct.
    [9usize, 14, 9, 4, 12, 2]
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let t: Vec<u32> = (0..n).map(|_| rng.gen_range(0..vocab as u32)).collect();
            // Prompt: the first half (at least one token); the rest is scored.
            let cut = (n / 2).max(1);
            ScoredSequence::new(i.to_string(), &t[..cut], &t[cut..]).unwrap()
        })
        .collect()
}

/// NLL of one sequence through the session's one-sequence path (`prefill_all_logits`).
fn single_nll(model: &ElmModel, cfg: &InferenceConfig, s: &ScoredSequence) -> f64 {
    let mut session = ElmSession::new(model, cfg.clone(), 1, s.tokens.len()).unwrap();
    let logits = session.prefill_all_logits(0, &s.tokens).unwrap();
    (s.first_scored..s.tokens.len())
        .map(|t| token_nll(logits.row(t - 1), s.tokens[t]))
        .sum()
}

#[test]
fn batched_equals_unbatched_for_dense_and_adaptive_elm() {
    let elm = elm_model();
    let dense = elm.dense_reference().unwrap();
    let seqs = random_seqs(elm.config().vocab_size);
    for (name, model) in [("dense", &dense), ("elm", &elm)] {
        for solver in [SolverConfig::anderson(), SolverConfig::picard()] {
            // A loose δ and few iterations: the solve stops far from the fixed point, where
            // a row's iterate depends on when it stopped and on Anderson's mixing, so a solve
            // that saw padding (or other rows) would show.
            let cfg = InferenceConfig {
                solver,
                stop: StopCriteria::absolute(0.3, 4),
                kv_mode: KvMode::OneStep,
                adaptive_prefill: true,
                ..InferenceConfig::default()
            };
            let batched = teacher_forced_nll(model, &cfg, &seqs, 8, |_| {}).unwrap();
            if name == "elm" {
                assert_eq!(batched.solver.tokens, seqs.len(), "one solve per sequence");
                assert!(batched.solver.mean_iterations > 1.0);
            }
            for (item, s) in batched.items.iter().zip(&seqs) {
                let one = single_nll(model, &cfg, s);
                assert!(
                    (item.value - one).abs() < 1e-5 * (1.0 + one.abs()),
                    "{name} item {}: batched {} vs alone {one}",
                    item.id,
                    item.value
                );
            }
        }
    }
}

#[test]
fn bad_inputs_are_typed_errors() {
    let (model, seqs, _) = fixture();
    let cfg = InferenceConfig::default();
    assert!(teacher_forced_nll(&model, &cfg, &seqs, 0, |_| {}).is_err());
    assert!(teacher_forced_nll(&model, &cfg, &[], 2, |_| {}).is_err());
    let mut bad = seqs[0].clone();
    bad.first_scored = bad.tokens.len();
    assert!(teacher_forced_nll(&model, &cfg, &[bad], 2, |_| {}).is_err());
    let mut oov = seqs[0].clone();
    oov.tokens[0] = 10_000;
    let e = teacher_forced_nll(&model, &cfg, &[oov], 2, |_| {}).unwrap_err();
    assert!(e.to_string().contains("out of range"), "{e}");
    assert!(ScoredSequence::new("x", &[], &[1]).is_err());
}

/// The real checkpoint's NLL tasks against llama.cpp on the same GGUF, scored by
/// tests/fixtures/gen/ref_harness_nll.py with lm-evaluation-harness's split (context's trailing whitespace
/// onto the continuation, joint encoding): all 164 HumanEval solutions and 100 GSM8K answers.
/// Same scored tokens item by item (an independent tokenizer and chat-template renderer), and
/// NLL per token within 0.05 nats per task (llama.cpp quantizes activations to 8 bits for the
/// Q4_1 products; we multiply in f32).
#[test]
fn nll_tasks_match_llama_cpp_with_the_harness_split() {
    use elm::eval::gsm8k::answer_nll;
    use elm::eval::humaneval::{load_problems, problems_path, solution_nll};
    let Some(path) = common::real_model() else {
        return;
    };
    let data_dir = elm::data::resolve_data_dir(None).unwrap();
    let Some(he) = common::fetched_file(problems_path(&data_dir), "HumanEval") else {
        return;
    };
    let f = common::fixture_json("eval/harness_nll_smollm2.json");
    let (weights, tok) = elm::model::load_pretrained(&path).unwrap();
    let model = ElmModel::dense(weights);
    let inference = InferenceConfig::default();
    let problems = load_problems(&he).unwrap();
    let humaneval = solution_nll(&model, &tok, &problems, &inference, 8, |_| {}).unwrap();
    let n_gsm = 100;
    let examples: Vec<_> = elm::data::load_gsm8k(&data_dir, elm::data::Split::Test)
        .unwrap()
        .into_iter()
        .take(n_gsm)
        .collect();
    let ids: Vec<String> = (0..n_gsm).map(|i| i.to_string()).collect();
    let gsm8k = answer_nll(&model, &tok, &ids, &examples, &inference, 8, |_| {}).unwrap();
    for (task, run, n) in [
        ("humaneval-nll", &humaneval, 164),
        ("gsm8k-nll", &gsm8k, n_gsm),
    ] {
        let want: Vec<&serde_json::Value> = f["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["task"] == task)
            .collect();
        assert_eq!(want.len(), n);
        assert_eq!(run.items.len(), n);
        let (mut ours, mut theirs, mut count) = (0.0, 0.0, 0.0);
        for (item, r) in run.items.iter().zip(&want) {
            assert_eq!(item.id, r["id"].as_str().unwrap(), "{task}: item order");
            assert_eq!(
                item.weight,
                r["scored"].as_f64().unwrap(),
                "{task} {}: scored tokens differ from the harness split",
                item.id
            );
            ours += item.value;
            theirs += r["nll_sum"].as_f64().unwrap();
            count += item.weight;
        }
        let (ours, theirs) = (ours / count, theirs / count);
        println!("{task}: ours {ours:.4} nats/token, llama.cpp {theirs:.4}");
        assert!(
            (ours - theirs).abs() < 0.05,
            "{task}: {ours} vs llama.cpp {theirs} nats/token"
        );
    }
}
