//! The teacher cache of ELM training: the dense teacher's states entering and leaving the
//! window, per training batch, on disk (see [`TeacherCache`]).

use std::path::PathBuf;
use std::time::Instant;

use ndarray::{Array3, ArrayD};
use serde::{Deserialize, Serialize};

use crate::data::Batch;
use crate::error::{ElmError, Result};
use crate::io::Fnv64;
use crate::model::ModelWeights;

use super::checkpoint::TensorMap;
use super::config::ElmConfig;

/// On-disk cache of the teacher's states `(h_l, h_{l+M})` of whole training batches.
///
/// The teacher (dense layers `[0, l+M)`, no tape) is a large share of a distillation step and
/// does not depend on the module: runs that see the same batches over the same window (the
/// gradient-rule and baseline variants of one study share the seed, batch size and sequence
/// length, hence the batches) compute it once. A file is keyed by a hash of the model (config,
/// path, file size and modification time, and the products' precision), the window and the
/// batch's token ids; it stores the exact f32 states, so a cached run is bit-identical to an
/// uncached one. Writes are atomic, so
/// concurrent or killed runs leave whole files only.
///
/// Each file records, in its header, the seconds its states took to compute, so that a run
/// that reads it can say what the cache saved it ([`TeacherCacheStats`]).
#[derive(Clone, Debug)]
pub struct TeacherCache {
    dir: PathBuf,
    model_key: String,
    pub(super) stats: TeacherCacheStats,
}

/// What the teacher cache did in one run (one invocation of a training).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TeacherCacheStats {
    /// Batches read from the cache.
    pub hits: usize,
    /// Batches computed (and written) by this run.
    pub misses: usize,
    /// Seconds this run spent computing the missed batches' states (the teacher's forward).
    pub compute_seconds: f64,
    /// Seconds this run spent reading the hit batches' files.
    pub read_seconds: f64,
    /// The compute seconds the hit batches' files record: the teacher work this run did not
    /// repeat, measured by the run that wrote each file.
    pub recorded_seconds: f64,
    /// Hits whose file records its compute seconds (files written before the cost was
    /// recorded carry none, so `recorded_seconds` undercounts when this is below `hits`).
    pub priced_hits: usize,
}

impl TeacherCacheStats {
    /// Seconds the cache saved this run (what the hits cost to compute minus what reading them
    /// cost), `None` when a hit's file does not record its cost.
    pub fn saved_seconds(&self) -> Option<f64> {
        (self.priced_hits == self.hits).then_some(self.recorded_seconds - self.read_seconds)
    }
}

/// Header key of a teacher-cache file holding the seconds its states took to compute.
const TEACHER_SECONDS_KEY: &str = "teacher_compute_seconds";

impl TeacherCache {
    pub(super) fn new(dir: PathBuf, dense: &ModelWeights, base_model: &str) -> Result<Self> {
        std::fs::create_dir_all(&dir).map_err(|e| ElmError::io(&dir, e))?;
        let file = std::fs::metadata(base_model)
            .ok()
            .map(|m| {
                let mtime = m
                    .modified()
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map_or(0, |d| d.as_nanos());
                format!("{}:{mtime}", m.len())
            })
            .unwrap_or_default();
        let config = serde_json::to_string(&dense.config).map_err(|e| ElmError::Json {
            what: "model config".into(),
            msg: e.to_string(),
        })?;
        Ok(TeacherCache {
            dir,
            model_key: teacher_model_key(&config, base_model, &file, crate::gemm::precision()),
            stats: TeacherCacheStats::default(),
        })
    }

    /// The teacher's states `(h_l, h_{l+M})` of `batch` (`[B, T, width]` each): read from the
    /// cache, or `compute`d and written to it; [`TeacherCacheStats`] counts either.
    pub(super) fn states(
        &mut self,
        elm: &ElmConfig,
        batch: &Batch,
        width: usize,
        compute: impl FnOnce() -> Result<(Array3<f32>, Array3<f32>)>,
    ) -> Result<(Array3<f32>, Array3<f32>)> {
        let path = self.path(elm, batch);
        let (b, t) = (batch.tokens.len(), batch.tokens.first().map_or(0, Vec::len));
        let c = width;
        if path.exists() {
            let read = Instant::now();
            let file = crate::io::tensor_file::load_f32_tensors(&path)?;
            // A file written before costs were recorded has no such key; a present but
            // unreadable one is a damaged file.
            let recorded = match file.metadata.get(TEACHER_SECONDS_KEY) {
                None => None,
                Some(v) => match v.parse::<f64>() {
                    Ok(s) if s.is_finite() && s >= 0.0 => Some(s),
                    _ => {
                        let msg = format!(
                            "header `{TEACHER_SECONDS_KEY}` is {v:?}, not a number of seconds"
                        );
                        return Err(ElmError::format(&path, msg));
                    }
                },
            };
            let mut map: TensorMap = file.tensors.into_iter().collect();
            let h = super::checkpoint::take_tensor(&mut map, "h", &[b, t, c], &path)?;
            let target = super::checkpoint::take_tensor(&mut map, "target", &[b, t, c], &path)?;
            let to3 = |a: ArrayD<f32>| {
                a.into_dimensionality::<ndarray::Ix3>()
                    .map_err(|e| ElmError::format(&path, e.to_string()))
            };
            let out = (to3(h)?, to3(target)?);
            let s = &mut self.stats;
            s.hits += 1;
            s.read_seconds += read.elapsed().as_secs_f64();
            if let Some(seconds) = recorded {
                s.recorded_seconds += seconds;
                s.priced_hits += 1;
            }
            return Ok(out);
        }
        let started = Instant::now();
        let (h, target) = compute()?;
        let seconds = started.elapsed().as_secs_f64();
        let mut map = TensorMap::new();
        map.insert("h".into(), h.clone().into_dyn());
        map.insert("target".into(), target.clone().into_dyn());
        let header = [(TEACHER_SECONDS_KEY.to_string(), format!("{seconds}"))];
        super::checkpoint::save_tensors(&path, &map, Some(header.into_iter().collect()))?;
        self.stats.misses += 1;
        self.stats.compute_seconds += seconds;
        Ok((h, target))
    }

    fn path(&self, elm: &ElmConfig, batch: &Batch) -> PathBuf {
        let mut h = Fnv64::new();
        h.write(b"elm-teacher-v1");
        h.write(self.model_key.as_bytes());
        h.write(&(elm.start_layer as u64).to_le_bytes());
        h.write(&(elm.end_layer() as u64).to_le_bytes());
        for row in &batch.tokens {
            h.write(&(row.len() as u64).to_le_bytes());
            for t in row {
                h.write(&t.to_le_bytes());
            }
        }
        self.dir
            .join(format!("teacher-{:016x}.safetensors", h.finish()))
    }
}

/// The model part of a teacher-cache key. States computed with bf16 products differ from f32
/// ones, so each precision has its own files (f32 keys are those written before the setting
/// existed).
fn teacher_model_key(
    config: &str,
    base_model: &str,
    file: &str,
    products: crate::gemm::Precision,
) -> String {
    let suffix = match products {
        crate::gemm::Precision::F32 => "",
        crate::gemm::Precision::Bf16 => "|bf16",
    };
    format!("{config}|{base_model}|{file}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::Precision;

    /// f32 keys are those of caches written before the precision setting; bf16 states never
    /// share a file with f32 ones.
    #[test]
    fn teacher_cache_keys_separate_the_precisions() {
        let f32_key = teacher_model_key("{}", "m.gguf", "1:2", Precision::F32);
        assert_eq!(f32_key, "{}|m.gguf|1:2");
        assert_ne!(
            teacher_model_key("{}", "m.gguf", "1:2", Precision::Bf16),
            f32_key
        );
    }
}
