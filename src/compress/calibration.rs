//! Calibration text and the dense model's residual stream on it.

use std::path::Path;

use ndarray::{s, Array3};

use crate::data::{gsm8k_path, load_examples, load_gsm8k, Example, Split};
use crate::error::{ElmError, Result};
use crate::formats::tokenizer::Tokenizer;
use crate::model::dense_pass::{embed, run_dense_layers};
use crate::model::ModelWeights;

/// Calibration tokens cut into chunks of one length (so batches need no padding).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Calibration {
    /// `[n_chunks][seq_len]` token ids.
    pub chunks: Vec<Vec<u32>>,
}

impl Calibration {
    /// Joins the token ids of `texts` (each followed by `separator` when given), cuts them into
    /// chunks of `seq_len` and keeps the first `max_tokens` tokens' worth of whole chunks.
    pub fn from_token_stream(
        texts: impl IntoIterator<Item = Vec<u32>>,
        separator: Option<u32>,
        seq_len: usize,
        max_tokens: usize,
    ) -> Result<Self> {
        if seq_len < 2 {
            return Err(ElmError::config("seq_len", "must be >= 2"));
        }
        let want = max_tokens / seq_len;
        if want == 0 {
            return Err(ElmError::config(
                "calibration_tokens",
                format!("{max_tokens} tokens make no chunk of {seq_len}"),
            ));
        }
        let mut stream: Vec<u32> = Vec::with_capacity(want * seq_len);
        for t in texts {
            stream.extend(t);
            stream.extend(separator);
            if stream.len() >= want * seq_len {
                break;
            }
        }
        let chunks: Vec<Vec<u32>> = stream
            .chunks_exact(seq_len)
            .take(want)
            .map(|c| c.to_vec())
            .collect();
        if chunks.is_empty() {
            return Err(ElmError::InvalidArgument(format!(
                "calibration text has {} tokens, fewer than one chunk of {seq_len}",
                stream.len()
            )));
        }
        Ok(Calibration { chunks })
    }

    /// Calibration from a `.jsonl` (question/answer or text records) or plain-text file: Q/A
    /// records as the chat prompt of the question followed by the answer, the way the models
    /// are tuned and evaluated.
    pub fn from_file(
        tok: &Tokenizer,
        path: &Path,
        seq_len: usize,
        max_tokens: usize,
    ) -> Result<Self> {
        Self::from_examples(tok, &load_examples(path)?, seq_len, max_tokens).map_err(|e| match e {
            ElmError::InvalidArgument(msg) => {
                ElmError::InvalidArgument(format!("{}: {msg}", path.display()))
            }
            other => other,
        })
    }

    /// Calibration from GSM8K's training split under `data_dir` (never its validation
    /// problems, which the searches score on).
    pub fn from_gsm8k_train(
        tok: &Tokenizer,
        data_dir: &Path,
        seq_len: usize,
        max_tokens: usize,
    ) -> Result<Self> {
        let examples: Vec<Example> = load_gsm8k(data_dir, Split::Train)?
            .into_iter()
            .map(Example::Qa)
            .collect();
        let path = gsm8k_path(data_dir, Split::Train);
        Self::from_examples(tok, &examples, seq_len, max_tokens).map_err(|e| match e {
            ElmError::InvalidArgument(msg) => {
                ElmError::InvalidArgument(format!("{} (train split): {msg}", path.display()))
            }
            other => other,
        })
    }

    /// Calibration from loaded examples (see [`Calibration::from_file`]).
    pub fn from_examples(
        tok: &Tokenizer,
        examples: &[Example],
        seq_len: usize,
        max_tokens: usize,
    ) -> Result<Self> {
        let layout = crate::data::QaLayout::of(tok);
        let texts = examples.iter().map(|e| match e {
            Example::Qa(q) => format!(
                "{}{}",
                layout.prompt(tok, &q.question),
                layout.answer(&q.answer)
            ),
            Example::Text(t) => t.clone(),
        });
        let mut ids = Vec::new();
        for t in texts {
            ids.push(tok.encode(&t, false)?);
            if ids.iter().map(Vec::len).sum::<usize>() >= max_tokens {
                break;
            }
        }
        Self::from_token_stream(ids, tok.eos_id(), seq_len, max_tokens)
    }

    /// Chunk length T.
    pub fn seq_len(&self) -> usize {
        self.chunks.first().map_or(0, Vec::len)
    }

    /// Number of calibration tokens.
    pub fn tokens(&self) -> usize {
        self.chunks.iter().map(Vec::len).sum()
    }
}

/// The dense residual stream `h_0 … h_N` at every layer boundary on the calibration chunks:
/// `h_0` = embeddings, `h_i` = input of layer `i`, `h_N` = output of the last layer (before the
/// final norm). Each `[n_chunks, T, C]`.
#[derive(Clone, Debug)]
pub struct BoundaryStates {
    pub states: Vec<Array3<f32>>,
}

impl BoundaryStates {
    /// Runs the dense model over `calib`, `batch` chunks at a time.
    pub fn collect(weights: &ModelWeights, calib: &Calibration, batch: usize) -> Result<Self> {
        let (n, t, c) = (
            calib.chunks.len(),
            calib.seq_len(),
            weights.config.hidden_size,
        );
        let layers = weights.config.num_layers;
        let mut states = vec![Array3::<f32>::zeros((n, t, c)); layers + 1];
        for (bi, chunk) in calib.chunks.chunks(batch.max(1)).enumerate() {
            let rows = bi * batch.max(1)..bi * batch.max(1) + chunk.len();
            let mut x = embed(weights, chunk)?;
            states[0].slice_mut(s![rows.clone(), .., ..]).assign(&x);
            for l in 0..layers {
                x = run_dense_layers(weights, x, l..l + 1)?;
                states[l + 1].slice_mut(s![rows.clone(), .., ..]).assign(&x);
            }
        }
        Ok(BoundaryStates { states })
    }

    /// Number of layers N (boundaries − 1).
    pub fn num_layers(&self) -> usize {
        self.states.len().saturating_sub(1)
    }
}
