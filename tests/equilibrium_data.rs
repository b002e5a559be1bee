//! Data loaders, batching, the resumable batch order, configs and atomic checkpoint I/O.

mod common;

use common::TempDir;
use std::collections::BTreeMap;

use elm::data::*;
use elm::equilibrium::checkpoint::{load_tensors, save_tensors};
use elm::equilibrium::config::{LambdaSchedule, TrainConfig};
use elm::io::write_atomic;
use elm::ElmError;
use ndarray::{ArrayD, IxDyn};

#[test]
fn jsonl_loader_accepts_qa_and_text_and_names_bad_lines() {
    let d = TempDir::new("jsonl");
    let p = d.join("mix.jsonl");
    std::fs::write(
        &p,
        "{\"question\":\"q1\",\"answer\":\"a #### 1\",\"extra\":3}\n\n{\"text\":\"hello\"}\n",
    )
    .unwrap();
    let ex = load_examples(&p).unwrap();
    assert_eq!(
        ex,
        vec![
            Example::Qa(QaExample {
                question: "q1".into(),
                answer: "a #### 1".into()
            }),
            Example::Text("hello".into())
        ]
    );
    std::fs::write(&p, "{\"question\":\"q\"}\n").unwrap();
    let e = load_examples(&p).unwrap_err();
    assert!(
        matches!(e, ElmError::Format { .. }) && e.to_string().contains("line 1"),
        "{e}"
    );
    std::fs::write(&p, "{\"text\": 5}\n").unwrap();
    assert!(load_examples(&p)
        .unwrap_err()
        .to_string()
        .contains("`text`"));
    std::fs::write(&p, "not json\n").unwrap();
    assert!(load_examples(&p)
        .unwrap_err()
        .to_string()
        .contains("invalid JSON"));
    let e = load_examples(&d.join("missing.jsonl")).unwrap_err();
    assert!(matches!(e, ElmError::Io { .. }));
    let t = d.join("doc.txt");
    std::fs::write(&t, "plain text").unwrap();
    assert_eq!(
        load_examples(&t).unwrap(),
        vec![Example::Text("plain text".into())]
    );
}

#[test]
fn qa_tokenization_masks_only_answer_tokens_and_batch_targets_shift() {
    // Byte-level toy encoder: one token per byte.
    let enc = |s: &str| -> elm::Result<Vec<u32>> { Ok(s.bytes().map(u32::from).collect()) };
    let prompt = |q: &str| format!("<u>{q}</u>");
    let ex = Example::Qa(QaExample {
        question: "ab".into(),
        answer: "7".into(),
    });
    let s = tokenize_example(&ex, 100, &prompt, &|a: &str| format!("{a}!"), &enc).unwrap();
    assert_eq!(s.tokens.len(), "<u>ab</u>".len() + 2);
    let n_prompt = "<u>ab</u>".len();
    assert!(s.loss_mask[..n_prompt].iter().all(|m| !m));
    assert!(s.loss_mask[n_prompt..].iter().all(|m| *m));
    let short = TokenSequence {
        tokens: vec![5, 6, 7],
        loss_mask: vec![false, true, true],
    };
    let b = make_batch(&[&s, &short], 0);
    assert_eq!(b.seq_len, s.tokens.len());
    assert_eq!(b.tokens[1], {
        let mut v = vec![5, 6, 7];
        v.resize(b.seq_len, 0);
        v
    });
    assert_eq!(&b.valid[1][..4], &[true, true, true, false]);
    assert_eq!(&b.targets[1][..4], &[Some(6), Some(7), None, None]);
    // Target at the last prompt position is the first answer token.
    assert_eq!(b.targets[0][n_prompt - 1], Some(b'7' as u32));
    assert_eq!(b.targets[0][n_prompt - 2], None);
    let t = tokenize_example(&ex, 4, &prompt, &|a: &str| format!("{a}!"), &enc).unwrap();
    assert_eq!(t.tokens.len(), 4);
}

#[test]
fn batch_order_is_a_seeded_permutation_per_epoch_and_pure() {
    let n = 10;
    let all: Vec<usize> = (0..5).flat_map(|s| batch_indices(n, 4, s, 7)).collect();
    // Epoch 0 = the first 10 samples: a permutation of 0..10.
    let mut e0 = all[..10].to_vec();
    e0.sort();
    assert_eq!(e0, (0..10).collect::<Vec<_>>());
    let mut e1 = all[10..20].to_vec();
    e1.sort();
    assert_eq!(e1, (0..10).collect::<Vec<_>>());
    assert_ne!(all[..10], all[10..20], "epochs are reshuffled");
    assert_eq!(
        batch_indices(n, 4, 3, 7),
        all[12..16].to_vec(),
        "pure in step"
    );
    assert_ne!(batch_indices(n, 4, 0, 8), batch_indices(n, 4, 0, 7));
}

#[test]
fn real_gsm8k_loads() {
    // GSM8K is committed in data/gsm8k: nothing to skip.
    let dir = resolve_data_dir(None).unwrap();
    assert!(gsm8k_path(&dir, Split::Train).exists());
    let train = load_gsm8k(&dir, Split::Train).unwrap();
    assert_eq!(train.len(), 7473 - VALIDATION_PROBLEMS);
    assert!(train[0].question.starts_with("Natalia sold clips"));
    assert!(train.iter().all(|e| e.answer.contains("####")));
}

/// The validation split is the end of train.jsonl, disjoint from what trainings read; the
/// seeded samples nest and name each problem by its index in its split.
#[test]
fn the_validation_split_is_carved_out_of_train_and_samples_nest() {
    let dir = resolve_data_dir(None).unwrap();
    let file: Vec<Example> = load_examples(&gsm8k_path(&dir, Split::Train)).unwrap();
    let train = load_gsm8k(&dir, Split::Train).unwrap();
    let val = load_gsm8k(&dir, Split::Validation).unwrap();
    assert_eq!((file.len(), val.len()), (7473, VALIDATION_PROBLEMS));
    assert_eq!(train.len() + val.len(), file.len());
    let questions: std::collections::HashSet<&str> =
        train.iter().map(|q| q.question.as_str()).collect();
    assert!(
        val.iter().all(|q| !questions.contains(q.question.as_str())),
        "no validation problem is a training problem"
    );
    match &file[file.len() - 1] {
        Example::Qa(q) => assert_eq!(q, val.last().unwrap(), "validation ends the file"),
        Example::Text(_) => panic!("GSM8K is question/answer"),
    }
    // Seeded samples: the same seed and size, the same problems; a smaller one inside a larger.
    let sample = |n, seed| {
        gsm8k_sample(&dir, Split::Test, ProblemSample::Seeded { n, seed })
            .unwrap()
            .into_iter()
            .map(|(i, _)| i)
            .collect::<Vec<_>>()
    };
    let (a, b) = (sample(300, 7), sample(60, 7));
    assert_eq!(a, sample(300, 7));
    assert_eq!(&a[..60], &b[..]);
    assert_ne!(a, sample(300, 8));
    assert!(
        a.iter().any(|&i| i >= 300),
        "a random sample, not the first problems"
    );
    let test = load_gsm8k(&dir, Split::Test).unwrap();
    let drawn = gsm8k_sample(&dir, Split::Test, ProblemSample::Seeded { n: 5, seed: 7 }).unwrap();
    assert!(
        drawn.iter().all(|(i, q)| &test[*i] == q),
        "ids index the split"
    );
    assert_eq!(
        gsm8k_sample(&dir, Split::Test, ProblemSample::First(3))
            .unwrap()
            .into_iter()
            .map(|(i, _)| i)
            .collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    // A file shorter than twice the validation size keeps its last half for validation.
    let small = TempDir::new("small-gsm8k");
    std::fs::create_dir_all(small.join("gsm8k")).unwrap();
    let lines: Vec<String> = (0..9)
        .map(|i| format!(r#"{{"question": "q{i}", "answer": "a #### {i}"}}"#))
        .collect();
    std::fs::write(small.join("gsm8k/train.jsonl"), lines.join("\n")).unwrap();
    assert_eq!(load_gsm8k(small.path(), Split::Train).unwrap().len(), 5);
    let v = load_gsm8k(small.path(), Split::Validation).unwrap();
    assert_eq!(v.len(), 4);
    assert_eq!(v[0].question, "q5");
}

fn elm_cli(args: &[&str]) -> (bool, serde_json::Value, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_elm"))
        .args(args)
        .output()
        .expect("run elm");
    (
        out.status.success(),
        serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// Every command that selects or stops (a training's held-out figures, a LoRA run's, the
/// window enumeration, the search's calibration) runs with no test file present: none of them
/// can read a test problem. Evaluating on the test split then fails naming the missing file.
#[test]
fn no_selection_path_reads_the_test_file() {
    use elm::model::{Arch, ModelConfig, ModelWeights};
    let d = TempDir::new("no-test-file");
    let model = d.join("tiny");
    common::write_word_model(
        &ModelWeights::random(&ModelConfig::tiny(Arch::Llama), 5),
        &model,
    );
    let data = d.join("data");
    std::fs::create_dir_all(data.join("gsm8k")).unwrap();
    let lines: Vec<String> = (0..40)
        .map(|i| {
            format!(
                r#"{{"question": "w{} w{} w{} w{}", "answer": "w{} w{} #### {i}"}}"#,
                3 + i % 50,
                4 + i % 50,
                5 + i % 50,
                6 + i % 50,
                7 + i % 50,
                8 + i % 50
            )
        })
        .collect();
    std::fs::write(data.join("gsm8k/train.jsonl"), lines.join("\n")).unwrap();
    assert!(!data.join("gsm8k/test.jsonl").exists());
    let (m, dd) = (model.to_str().unwrap(), data.to_str().unwrap());
    let steps = d.join("steps.json");
    std::fs::write(&steps, r#"{"steps": 1, "seq_len": 32, "batch_size": 1}"#).unwrap();
    let out = |name: &str| d.join(name).display().to_string();
    let (train, lora, search) = (out("train"), out("lora"), out("search"));
    let s = steps.to_str().unwrap();
    let (ok, v, err) = elm_cli(&[
        "train",
        "--model",
        m,
        "--start",
        "1",
        "--num-replaced",
        "2",
        "--config",
        s,
        "--data-dir",
        dd,
        "--eval-examples",
        "3",
        "--out",
        &train,
        "--json",
    ]);
    assert!(ok, "elm train: {err}");
    assert!(
        v["distill_after"].is_number(),
        "held-out figures on validation: {v}"
    );
    assert_eq!(
        v["sequences"], 20,
        "the training read the 20 training problems only: {v}"
    );
    let (ok, v, err) = elm_cli(&[
        "lora",
        "--model",
        m,
        "--config",
        s,
        "--data-dir",
        dd,
        "--eval-examples",
        "3",
        "--out",
        &lora,
        "--json",
    ]);
    assert!(ok, "elm lora: {err}");
    assert_eq!(v["held_out_examples"], 3, "{v}");
    let (ok, _, err) = elm_cli(&[
        "search",
        "--model",
        m,
        "--method",
        "enumerate",
        "--num-replaced",
        "2",
        "--steps",
        "1",
        "--seq-len",
        "32",
        "--calibration-tokens",
        "64",
        "--calibration-seq-len",
        "16",
        "--data-dir",
        dd,
        "--eval-examples",
        "3",
        "--out",
        &search,
        "--json",
    ]);
    assert!(ok, "elm search --method enumerate: {err}");
    let eval = |split: &str| {
        elm_cli(&[
            "eval",
            "--model",
            m,
            "--task",
            "gsm8k-nll",
            "--split",
            split,
            "--limit",
            "3",
            "--data-dir",
            dd,
            "--json",
        ])
    };
    let (ok, v, err) = eval("validation");
    assert!(ok, "elm eval --split validation: {err}");
    assert_eq!(v["n"], 3, "{v}");
    let (ok, _, err) = eval("test");
    assert!(!ok && err.contains("test.jsonl"), "{err}");
    let (ok, _, err) = eval("train");
    assert!(!ok && err.contains("split"), "{err}");
}

#[test]
fn train_config_defaults_and_unknown_keys() {
    let c = TrainConfig::default();
    assert_eq!(c.optim.lr, 2e-4);
    assert_eq!(c.optim.betas, [0.9, 0.95]);
    assert_eq!(
        (
            c.optim.warmup_frac,
            c.optim.min_lr_frac,
            c.optim.weight_decay,
            c.optim.clip
        ),
        (0.1, 0.01, 0.02, 0.1)
    );
    c.validate().unwrap();
    let e = serde_json::from_str::<TrainConfig>("{\"stepz\": 3}").unwrap_err();
    assert!(e.to_string().contains("stepz"), "{e}");
    let d = TempDir::new("cfg");
    let p = d.join("t.json");
    std::fs::write(
        &p,
        "{\"steps\": 5, \"lambda\": {\"ce_start\": 0.2, \"bogus\": 1}}",
    )
    .unwrap();
    let e = TrainConfig::from_file(&p).unwrap_err();
    assert!(
        e.to_string().contains("bogus") && e.to_string().contains("t.json"),
        "{e}"
    );
    let bad: TrainConfig = serde_json::from_str("{\"steps\": 0}").unwrap();
    assert!(bad.validate().unwrap_err().to_string().contains("steps"));
}

#[test]
fn lambda_schedule_zero_then_sine_ramp() {
    let s = LambdaSchedule::default();
    assert_eq!(s.at(0, 100), (0.0, 1.0));
    assert_eq!(s.at(49, 100).0, 0.0);
    assert_eq!(s.at(50, 100).0, 0.0);
    let want = (std::f32::consts::FRAC_PI_2 * 0.5).sin();
    assert!((s.at(75, 100).0 - want).abs() < 1e-6);
    assert_eq!(s.at(100, 100).0, 1.0);
}

#[test]
fn safetensors_round_trip_and_atomic_write_and_corrupt_file() {
    let d = TempDir::new("st");
    let p = d.join("x.safetensors");
    let mut m = BTreeMap::new();
    m.insert(
        "a".to_string(),
        ArrayD::from_shape_vec(IxDyn(&[2, 3]), (0..6).map(|x| x as f32 * 0.5).collect()).unwrap(),
    );
    m.insert("b.c".to_string(), ArrayD::from_elem(IxDyn(&[4]), -1.25f32));
    save_tensors(&p, &m, None).unwrap();
    assert_eq!(load_tensors(&p).unwrap(), m);
    // No temp files left behind.
    let left: Vec<_> = std::fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left.len(), 1, "{left:?}");
    let raw = std::fs::read(&p).unwrap();
    write_atomic(&p, &raw[..raw.len() / 2]).unwrap();
    let e = load_tensors(&p).unwrap_err();
    assert!(
        matches!(e, ElmError::Format { .. }) && e.to_string().contains("x.safetensors"),
        "{e}"
    );
}
