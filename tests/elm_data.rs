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
    assert_eq!(train.len(), 7473);
    assert!(train[0].question.starts_with("Natalia sold clips"));
    assert!(train.iter().all(|e| e.answer.contains("####")));
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
