//! The enumeration GPPO must match: train the candidate ELM at every start layer (or every
//! k-th) for the same short budget, on the same batches, and rank the windows by held-out
//! answer NLL. The dense teacher states of the training batches and of the held-out set are
//! computed once and shared by every candidate. Each finished candidate is appended to
//! `enumeration.json` (atomically), so an interrupted run resumes at the next start.

use std::path::Path;
use std::time::Instant;

use rand::{rngs::StdRng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::data::{batch_indices, TokenSequence};
use crate::error::{ElmError, Result};
use crate::eval::stats::{estimate, BootstrapConfig, ItemScore};
use crate::io::read_json;
use crate::io::write_json_atomic;
use crate::model::ModelWeights;
use crate::train::step_seed;

use super::candidate::{CandidateConfig, Candidates, TeacherBatch};

/// `elm search --method enumerate` settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnumConfig {
    pub candidate: CandidateConfig,
    /// Training steps per candidate.
    pub steps: usize,
    /// Train every k-th start (1 = all); the last start `N − M` is always included.
    #[serde(default = "one")]
    pub every: usize,
}

fn one() -> usize {
    1
}

impl EnumConfig {
    pub fn validate(&self, model: &crate::model::ModelConfig) -> Result<()> {
        if self.steps == 0 {
            return Err(ElmError::config("steps", "must be > 0"));
        }
        if self.every == 0 {
            return Err(ElmError::config("every", "must be >= 1"));
        }
        self.candidate.validate(model)
    }

    /// The starts trained: `0, k, 2k, …` and `N − M`.
    pub fn starts(&self, model: &crate::model::ModelConfig) -> Vec<usize> {
        let k = self.candidate.num_starts(model);
        let mut s: Vec<usize> = (0..k).step_by(self.every.max(1)).collect();
        if s.last() != Some(&(k - 1)) {
            s.push(k - 1);
        }
        s
    }
}

/// One enumerated window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnumEntry {
    pub start: usize,
    /// Held-out answer NLL (nats/token) after training, and before (the initialised candidate).
    pub nll: f64,
    /// 95% percentile-bootstrap interval of `nll` over the held-out problems (absent from
    /// enumerations written before it was recorded).
    #[serde(default)]
    pub nll_interval: Option<(f64, f64)>,
    pub nll_init: f64,
    /// Mean training CE of the last quarter of the steps.
    pub train_ce_last: f64,
    pub seconds: f64,
}

/// `enumeration.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Enumeration {
    pub config: EnumConfig,
    pub num_layers: usize,
    pub held_out_examples: usize,
    pub held_out_tokens: usize,
    /// Dense (no window replaced) held-out answer NLL, the floor.
    pub dense_nll: f64,
    pub entries: Vec<EnumEntry>,
}

impl Enumeration {
    /// Starts ranked best first (lowest NLL; ties: lower start).
    pub fn ranking(&self) -> Vec<usize> {
        let mut e: Vec<&EnumEntry> = self.entries.iter().collect();
        e.sort_by(|a, b| a.nll.total_cmp(&b.nll).then(a.start.cmp(&b.start)));
        e.into_iter().map(|x| x.start).collect()
    }
    /// 1-based rank of `start` among the enumerated windows.
    pub fn rank_of(&self, start: usize) -> Option<usize> {
        self.ranking()
            .iter()
            .position(|&s| s == start)
            .map(|p| p + 1)
    }
}

pub const ENUM_FILE: &str = "enumeration.json";

/// Trains and scores every start of `cfg.starts`; `held` are held-out sequences (answer
/// tokens scored). With `out`, progress is saved to `out/enumeration.json` after each start and
/// starts already there are skipped. `on_start(start, entry)` after each.
#[allow(clippy::too_many_arguments)] // model, settings, data, output and two callbacks
pub fn enumerate(
    dense: &ModelWeights,
    cfg: &EnumConfig,
    data: &[TokenSequence],
    held: &[TokenSequence],
    pad_id: u32,
    out: Option<&Path>,
    mut on_step: impl FnMut(usize, usize),
    mut on_start: impl FnMut(&EnumEntry),
) -> Result<Enumeration> {
    cfg.validate(&dense.config)?;
    if data.is_empty() || held.is_empty() {
        return Err(ElmError::InvalidArgument(
            "enumeration needs training and held-out sequences".into(),
        ));
    }
    let c = &cfg.candidate;
    // Shared teacher states: the training batches (same for every candidate) and held-out.
    let train: Vec<TeacherBatch> = (0..cfg.steps)
        .map(|step| {
            let idx = batch_indices(data.len(), c.batch_size, step, c.seed);
            let seqs: Vec<&TokenSequence> = idx.iter().map(|&i| &data[i]).collect();
            TeacherBatch::new(dense, &seqs, pad_id, None)
        })
        .collect::<Result<_>>()?;
    let held_batches: Vec<TeacherBatch> = held
        .chunks(4)
        .map(|ch| {
            let refs: Vec<&TokenSequence> = ch.iter().collect();
            TeacherBatch::new(dense, &refs, pad_id, None)
        })
        .collect::<Result<_>>()?;
    let n = dense.config.num_layers;
    let (mut dsum, mut dcount) = (0.0, 0);
    for tb in &held_batches {
        let (s, k) = super::candidate::answer_nll_of_hidden(dense, &tb.states[n], &tb.batch)?;
        dsum += s;
        dcount += k;
    }
    let mut result = Enumeration {
        config: cfg.clone(),
        num_layers: n,
        held_out_examples: held.len(),
        held_out_tokens: dcount,
        dense_nll: dsum / dcount.max(1) as f64,
        entries: vec![],
    };
    if let Some(dir) = out {
        // Temporaries of a killed run were never renamed into place: nothing refers to them.
        crate::io::atomic::remove_stale_temps(dir)?;
        let p = dir.join(ENUM_FILE);
        if p.exists() {
            let prev: Enumeration = read_json(&p)?;
            if prev.config != *cfg || prev.num_layers != n || prev.held_out_examples != held.len() {
                return Err(ElmError::config(
                    "out",
                    format!(
                        "{} holds an enumeration with other settings (use another --out)",
                        p.display()
                    ),
                ));
            }
            result.entries = prev.entries;
        }
    }
    let sched = c.optim.schedule(cfg.steps)?;
    for start in cfg.starts(&dense.config) {
        if result.entries.iter().any(|e| e.start == start) {
            continue;
        }
        let t0 = Instant::now();
        let mut cands = Candidates::new(dense, c.clone(), &[start])?;
        let (s0, k0) = cands.heldout_nll(start, &held_batches)?;
        let mut ces = vec![];
        for (step, tb) in train.iter().enumerate() {
            let mut rng = StdRng::seed_from_u64(step_seed(c.seed ^ 0x656E_756D, step));
            let st = cands.train_step(start, tb, sched.lr_at(step), &mut rng)?;
            ces.push(st.ce);
            on_step(start, step);
        }
        let rows = cands.heldout_nll_rows(start, &held_batches)?;
        let (s1, k1) = rows
            .iter()
            .fold((0.0, 0), |(s, c), &(rs, rc)| (s + rs, c + rc));
        let items: Vec<ItemScore> = rows
            .iter()
            .enumerate()
            .filter(|(_, &(_, c))| c > 0)
            .map(|(i, &(value, c))| ItemScore {
                id: i.to_string(),
                value,
                weight: c as f64,
            })
            .collect();
        // No interval without a scored held-out problem (tiny data sets).
        let interval = match items.is_empty() {
            true => None,
            false => Some(estimate(&items, &BootstrapConfig::default())?),
        };
        let q = (ces.len() / 4).max(1);
        let entry = EnumEntry {
            start,
            nll: s1 / k1.max(1) as f64,
            nll_interval: interval.map(|i| (i.lo, i.hi)),
            nll_init: s0 / k0.max(1) as f64,
            train_ce_last: ces[ces.len() - q..].iter().sum::<f64>() / q as f64,
            seconds: t0.elapsed().as_secs_f64(),
        };
        on_start(&entry);
        result.entries.push(entry);
        if let Some(dir) = out {
            std::fs::create_dir_all(dir).map_err(|e| ElmError::io(dir, e))?;
            write_json_atomic(&dir.join(ENUM_FILE), &result)?;
        }
    }
    result.entries.sort_by_key(|e| e.start);
    Ok(result)
}
