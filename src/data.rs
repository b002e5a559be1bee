//! Training/evaluation data: GSM8K and generic jsonl/text loaders, chat-formatted token
//! sequences with answer-only loss masks, and a seeded, resumable batch order.
//!
//! The data directory is resolved as: the explicit `--data-dir`, else env `ELM_DATA_DIR`,
//! else the repository's own `data/` (GSM8K is committed there; HumanEval is fetched into it
//! by `scripts/fetch-humaneval.sh`).

use std::path::{Path, PathBuf};

use rand::seq::SliceRandom;
use rand::SeedableRng;

use crate::error::{ElmError, Result};
use crate::formats::tokenizer::Tokenizer;

/// One question/answer pair (GSM8K `answer` ends with `#### N`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QaExample {
    pub question: String,
    pub answer: String,
}

/// One loaded example of a generic dataset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Example {
    /// Chat-formatted: loss on the answer only.
    Qa(QaExample),
    /// Plain text: loss on every token.
    Text(String),
}

/// GSM8K split. GSM8K ships two files; `Validation` is carved out of `train.jsonl` so that
/// everything that selects or stops (held-out figures during training, the window searches,
/// the choice of a study's best baseline) has problems of its own, and only the final tables
/// read `test.jsonl`: its last [`VALIDATION_PROBLEMS`] problems (the last half of a file
/// shorter than twice that, so that a small fixture keeps both parts). `Train` is the rest, and
/// every training reads only that.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    Train,
    Validation,
    Test,
}

/// Problems of GSM8K's `train.jsonl` held out as the validation split (the last ones).
pub const VALIDATION_PROBLEMS: usize = 500;

impl Split {
    /// The file the split's problems are read from.
    fn file_name(self) -> &'static str {
        match self {
            Split::Train | Split::Validation => "train.jsonl",
            Split::Test => "test.jsonl",
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Validation => "validation",
            Split::Test => "test",
        }
    }
    /// The split's problems among the `n` of its file: the range of indices it keeps.
    fn range(self, n: usize) -> std::ops::Range<usize> {
        let held = if n >= 2 * VALIDATION_PROBLEMS {
            VALIDATION_PROBLEMS
        } else {
            n / 2
        };
        match self {
            Split::Train => 0..n - held,
            Split::Validation => n - held..n,
            Split::Test => 0..n,
        }
    }
}

impl std::str::FromStr for Split {
    type Err = ElmError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "train" => Ok(Split::Train),
            "validation" => Ok(Split::Validation),
            "test" => Ok(Split::Test),
            other => Err(ElmError::config(
                "split",
                format!("unknown split `{other}` (train, validation, test)"),
            )),
        }
    }
}

/// The repository's `data/` directory.
pub fn default_data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("data")
}

/// Resolves the data directory (see module doc). Errors if none is found.
pub fn resolve_data_dir(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    if let Ok(p) = std::env::var("ELM_DATA_DIR") {
        return Ok(PathBuf::from(p));
    }
    let default = default_data_dir();
    if default.is_dir() {
        return Ok(default);
    }
    Err(ElmError::config(
        "data-dir",
        format!(
            "no data directory: pass --data-dir or set ELM_DATA_DIR (default {} does not exist)",
            default.display()
        ),
    ))
}

/// Path of a GSM8K split file under a data directory.
pub fn gsm8k_path(data_dir: &Path, split: Split) -> PathBuf {
    data_dir.join("gsm8k").join(split.file_name())
}

/// Loads a GSM8K split (`<data_dir>/gsm8k/{train,test}.jsonl`; see [`Split`] for the
/// validation problems' place).
pub fn load_gsm8k(data_dir: &Path, split: Split) -> Result<Vec<QaExample>> {
    Ok(load_gsm8k_indexed(data_dir, split)?
        .into_iter()
        .map(|(_, q)| q)
        .collect())
}

/// [`load_gsm8k`] with each problem's 0-based index within its split (the id a per-problem
/// score carries, so that two runs' scores pair however each sampled them).
pub fn load_gsm8k_indexed(data_dir: &Path, split: Split) -> Result<Vec<(usize, QaExample)>> {
    let path = gsm8k_path(data_dir, split);
    let all = load_examples_with_lines(&path)?;
    let keep = split.range(all.len());
    all.into_iter()
        .skip(keep.start)
        .take(keep.len())
        .enumerate()
        .map(|(i, (line, e))| match e {
            Example::Qa(q) if gsm8k_final_answer(&q.answer).is_some() => Ok((i, q)),
            Example::Qa(q) => Err(ElmError::format(
                &path,
                format!(
                    "line {line}: field `answer` has no final `#### N` marker (N a number): {:?}",
                    tail(&q.answer)
                ),
            )),
            Example::Text(_) => Err(ElmError::format(
                &path,
                format!("line {line}: expected `question` and `answer` fields"),
            )),
        })
        .collect()
}

/// The last 60 characters of `s` (for error messages).
fn tail(s: &str) -> &str {
    let start = s.char_indices().rev().nth(59).map_or(0, |(i, _)| i);
    &s[start..]
}

/// The final answer of a GSM8K solution: the text after its last `#### `, which must be a
/// number (`-?[0-9.,]+` containing a digit, surrounding whitespace allowed); `None` when the
/// marker or the number is missing.
pub fn gsm8k_final_answer(answer: &str) -> Option<&str> {
    let pos = answer.rfind("#### ")?;
    let n = answer[pos + "#### ".len()..].trim();
    let digits = n.strip_prefix('-').unwrap_or(n);
    let numeric = !digits.is_empty()
        && digits
            .chars()
            .all(|c| c.is_ascii_digit() || c == ',' || c == '.')
        && digits.chars().any(|c| c.is_ascii_digit());
    numeric.then_some(n)
}

/// Generic loader. `.jsonl`: one object per line with either `question`+`answer` (strings)
/// or `text` (string); other fields are ignored. Any other extension: the whole file is one
/// text example. Empty lines in jsonl are skipped.
pub fn load_examples(path: &Path) -> Result<Vec<Example>> {
    Ok(load_examples_with_lines(path)?
        .into_iter()
        .map(|(_, e)| e)
        .collect())
}

/// [`load_examples`] with each example's 1-based line number (1 for a text file).
pub fn load_examples_with_lines(path: &Path) -> Result<Vec<(usize, Example)>> {
    let raw = std::fs::read_to_string(path).map_err(|e| ElmError::io(path, e))?;
    let is_jsonl = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("jsonl"));
    if !is_jsonl {
        if raw.trim().is_empty() {
            return Err(ElmError::format(path, "text file is empty"));
        }
        return Ok(vec![(1, Example::Text(raw))]);
    }
    let mut out = Vec::new();
    for (i, line) in raw.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(line)
            .map_err(|e| ElmError::format(path, format!("line {}: invalid JSON: {e}", i + 1)))?;
        let field = |k: &str| -> Result<Option<String>> {
            match v.get(k) {
                None => Ok(None),
                Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(ElmError::format(
                    path,
                    format!("line {}: field `{k}` is not a string", i + 1),
                )),
            }
        };
        match (field("question")?, field("answer")?, field("text")?) {
            (Some(question), Some(answer), _) => {
                out.push((i + 1, Example::Qa(QaExample { question, answer })))
            }
            (None, None, Some(t)) => out.push((i + 1, Example::Text(t))),
            _ => {
                return Err(ElmError::format(
                    path,
                    format!(
                        "line {}: need `question`+`answer` or `text` string fields",
                        i + 1
                    ),
                ))
            }
        }
    }
    if out.is_empty() {
        return Err(ElmError::format(path, "no examples"));
    }
    Ok(out)
}

/// A tokenized training sequence. `loss_mask[t]` says whether token `t` is a prediction
/// target (answer tokens for Q/A data, all but the first for text).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenSequence {
    pub tokens: Vec<u32>,
    pub loss_mask: Vec<bool>,
}

/// Tokens of `context ++ continuation` and the index of the first continuation token, split as
/// lm-evaluation-harness splits a log-likelihood request: the context's trailing whitespace is
/// moved onto the continuation, the joint text is encoded once, and the continuation is what
/// follows the first `len(encode(context))` tokens.
///
/// Encoding the continuation on its own would start it with tokens the model never sees in
/// running text (a HumanEval prompt's closing newline merges with the solution's indentation).
pub fn encode_continuation(
    context: &str,
    continuation: &str,
    encode: &dyn Fn(&str) -> Result<Vec<u32>>,
) -> Result<(Vec<u32>, usize)> {
    let kept = context.trim_end();
    let joint = format!("{context}{continuation}");
    let tokens = encode(&joint)?;
    let first = encode(kept)?.len();
    if kept.is_empty() || first == 0 {
        return Err(ElmError::InvalidArgument(format!(
            "context {:?} has no tokens once its trailing whitespace is moved to the continuation",
            truncate_chars(context, 60)
        )));
    }
    if tokens.len() <= first {
        return Err(ElmError::InvalidArgument(format!(
            "continuation {:?} adds no tokens to its context ({} joint tokens, {} context tokens)",
            truncate_chars(continuation, 60),
            tokens.len(),
            first
        )));
    }
    Ok((tokens, first))
}

fn truncate_chars(s: &str, n: usize) -> String {
    match s.char_indices().nth(n) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// Tokenizes Q/A examples as `prompt(question) ++ answer(answer)` ([`QaLayout`]: the prompt
/// ready for the answer, the answer with what opens and closes it). The loss mask covers the
/// continuation as [`encode_continuation`] splits it, so training and evaluation score the same
/// tokens that lm-evaluation-harness would. Sequences are truncated to `max_len` tokens.
pub fn tokenize_example(
    ex: &Example,
    max_len: usize,
    prompt: &dyn Fn(&str) -> String,
    answer: &dyn Fn(&str) -> String,
    encode: &dyn Fn(&str) -> Result<Vec<u32>>,
) -> Result<TokenSequence> {
    let (mut tokens, mut loss_mask) = match ex {
        Example::Qa(q) => {
            let (toks, first) =
                encode_continuation(&prompt(&q.question), &answer(&q.answer), encode)?;
            let mut mask = vec![false; first];
            mask.resize(toks.len(), true);
            (toks, mask)
        }
        Example::Text(t) => {
            let toks = encode(t)?;
            let mut mask = vec![true; toks.len()];
            if let Some(m) = mask.first_mut() {
                *m = false;
            }
            (toks, mask)
        }
    };
    tokens.truncate(max_len);
    loss_mask.truncate(max_len);
    Ok(TokenSequence { tokens, loss_mask })
}

/// A padded batch ready for the model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    /// `[B][T]` token ids, right-padded with `pad_id`.
    pub tokens: Vec<Vec<u32>>,
    /// `[B][T]` true on real (non-pad) tokens: the distillation MSE averages over these.
    pub valid: Vec<Vec<bool>>,
    /// `[B][T]` next-token target of position t, or `None` when position t+1 is not a loss
    /// token (CE ignore index).
    pub targets: Vec<Vec<Option<u32>>>,
    /// T.
    pub seq_len: usize,
}

impl Batch {
    /// Whether any position has a CE target (a batch whose answers all lie past `seq_len`
    /// has none: there is nothing for a cross-entropy term to fit).
    pub fn has_targets(&self) -> bool {
        self.targets.iter().flatten().any(Option::is_some)
    }
}

/// Pads `seqs` to the longest one (at most `max_len`).
pub fn make_batch(seqs: &[&TokenSequence], pad_id: u32) -> Batch {
    let seq_len = seqs.iter().map(|s| s.tokens.len()).max().unwrap_or(0);
    let mut tokens = Vec::with_capacity(seqs.len());
    let mut valid = Vec::with_capacity(seqs.len());
    let mut targets = Vec::with_capacity(seqs.len());
    for s in seqs {
        let n = s.tokens.len();
        let mut t = s.tokens.clone();
        t.resize(seq_len, pad_id);
        let mut v = vec![true; n];
        v.resize(seq_len, false);
        let tg = (0..seq_len)
            .map(|i| (i + 1 < n && s.loss_mask[i + 1]).then(|| s.tokens[i + 1]))
            .collect();
        tokens.push(t);
        valid.push(v);
        targets.push(tg);
    }
    Batch {
        tokens,
        valid,
        targets,
        seq_len,
    }
}

/// Example indices of batch `step`: the stream of examples is a seeded permutation per epoch,
/// so the order is a pure function of `(n, batch, step, seed)` — a resumed run sees exactly
/// the data an uninterrupted one would.
pub fn batch_indices(n: usize, batch: usize, step: usize, seed: u64) -> Vec<usize> {
    assert!(n > 0, "batch_indices on an empty dataset");
    let mut out = Vec::with_capacity(batch);
    let mut cached: Option<(usize, Vec<usize>)> = None;
    for i in 0..batch {
        let k = step * batch + i;
        let (epoch, pos) = (k / n, k % n);
        if cached.as_ref().map(|c| c.0) != Some(epoch) {
            cached = Some((epoch, epoch_permutation(n, seed, epoch)));
        }
        out.push(cached.as_ref().unwrap().1[pos]);
    }
    out
}

fn epoch_permutation(n: usize, seed: u64, epoch: usize) -> Vec<usize> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(
        seed ^ (epoch as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
    );
    let mut p: Vec<usize> = (0..n).collect();
    p.shuffle(&mut rng);
    p
}

/// The text of a plain or jsonl file (jsonl records joined by blank lines).
pub fn read_text_file(path: &Path) -> Result<String> {
    let raw = crate::io::read_text_capped(path, crate::limits::MAX_TEXT_FILE_BYTES)?;
    if path.extension().is_some_and(|e| e == "jsonl") {
        let mut parts = Vec::new();
        for (n, line) in raw
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let v: serde_json::Value = serde_json::from_str(line).map_err(|e| {
                ElmError::format(path, format!("line {}: invalid JSON: {e}", n + 1))
            })?;
            let field = |k: &str| v.get(k).and_then(|x| x.as_str());
            let text = match (field("text"), field("question"), field("answer")) {
                (Some(t), _, _) => t.to_string(),
                (None, Some(q), Some(a)) => format!("{q}\n{a}"),
                _ => {
                    return Err(ElmError::format(
                        path,
                        format!(
                            "line {}: needs a `text` or `question`+`answer` field",
                            n + 1
                        ),
                    ))
                }
            };
            parts.push(text);
        }
        Ok(parts.join("\n\n"))
    } else {
        Ok(raw)
    }
}

/// How a question and its answer are laid out as text for a model.
///
/// - `Chat` (the tokenizer has a chat template: a chat-tuned model such as SmolLM2-Instruct): the
///   question as a ChatML user turn with the generation prompt; the answer closed by
///   `<|im_end|>\n`, the end of the assistant turn.
/// - `Base` (no chat template: a base model such as Gemma 3 270M): lm-evaluation-harness's
///   `gsm8k` task layout for base models, `Question: {question}\nAnswer:` then the target
///   delimiter `" "` and the answer, BOS first when the tokenizer adds one. The answer is closed
///   by the harness's few-shot delimiter `\n\n`, so a scored answer ends the way an answer in a
///   few-shot prompt does. Used zero-shot here (the harness's `--num_fewshot 0`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QaLayout {
    Chat,
    Base,
}

impl QaLayout {
    /// The layout for `tok`'s model.
    pub fn of(tok: &Tokenizer) -> Self {
        if tok.has_chat_template() {
            QaLayout::Chat
        } else {
            QaLayout::Base
        }
    }

    /// The prompt text for `question`, ready for the answer.
    pub fn prompt(self, tok: &Tokenizer, question: &str) -> String {
        match self {
            QaLayout::Chat => tok.apply_chat_template(&[("user", question)], true),
            QaLayout::Base => {
                // The BOS token's text: `encode(.., false)` reads it back as the special token.
                let bos = match (tok.prepends_bos(), tok.bos_id()) {
                    (true, Some(id)) => tok.id_to_token(id).unwrap_or_default(),
                    _ => String::new(),
                };
                format!("{bos}Question: {question}\nAnswer:")
            }
        }
    }

    /// The reference `answer` as the continuation scored after [`Self::prompt`].
    pub fn answer(self, answer: &str) -> String {
        match self {
            QaLayout::Chat => format!("{answer}<|im_end|>\n"),
            QaLayout::Base => format!(" {answer}\n\n"),
        }
    }
}

/// A question laid out for `tok`'s model ([`QaLayout::prompt`]), ready for the answer.
pub fn qa_prompt(tok: &Tokenizer, question: &str) -> String {
    QaLayout::of(tok).prompt(tok, question)
}

/// Tokenizes examples into training sequences (Q/A in the model's [`QaLayout`]); sequences
/// under two tokens carry no next-token target and are left out.
pub fn tokenize_all(
    tok: &Tokenizer,
    examples: &[Example],
    max_len: usize,
) -> Result<Vec<TokenSequence>> {
    let layout = QaLayout::of(tok);
    let prompt = |q: &str| layout.prompt(tok, q);
    let answer = |a: &str| layout.answer(a);
    let enc = |s: &str| tok.encode(s, false);
    examples
        .iter()
        .map(|e| tokenize_example(e, max_len, &prompt, &answer, &enc))
        .filter(|r| r.as_ref().map_or(true, |s| s.tokens.len() >= 2))
        .collect()
}

/// Training sequences of `data` (a .jsonl of examples) or, without it, of GSM8K train under
/// `data_dir`, with the number dropped: a prompt longer than `seq_len` leaves no answer token
/// to supervise, so such a sequence carries no signal (and would make an all-prompt batch).
/// None left is an error.
pub fn training_sequences(
    tok: &Tokenizer,
    data: Option<&Path>,
    data_dir: Option<&Path>,
    seq_len: usize,
) -> Result<(Vec<TokenSequence>, usize)> {
    let examples: Vec<Example> = match data {
        Some(p) => load_examples(p)?,
        None => load_gsm8k(&resolve_data_dir(data_dir)?, Split::Train)?
            .into_iter()
            .map(Example::Qa)
            .collect(),
    };
    let mut seqs = tokenize_all(tok, &examples, seq_len)?;
    let total = seqs.len();
    seqs.retain(|s| s.loss_mask.iter().skip(1).any(|&m| m));
    if seqs.is_empty() {
        return Err(ElmError::config(
            "seq_len",
            format!(
                "{seq_len} tokens leave no answer token in any of the {total} training sequences"
            ),
        ));
    }
    let dropped = total - seqs.len();
    Ok((seqs, dropped))
}

/// Which problems of a split an evaluation reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProblemSample {
    /// The first `n` in file order.
    First(usize),
    /// `n` drawn without replacement by a seeded shuffle: the first `n` of one permutation of the
    /// split, so that a smaller sample lies inside a larger one with the same seed and two runs
    /// with the same seed and size score the same problems.
    Seeded { n: usize, seed: u64 },
}

impl ProblemSample {
    pub fn size(self) -> usize {
        match self {
            ProblemSample::First(n) | ProblemSample::Seeded { n, .. } => n,
        }
    }
}

/// `sample` of GSM8K's `split` under `data_dir`, each problem with its index in the split.
/// Asking for more problems than the split has gives all of them.
pub fn gsm8k_sample(
    data_dir: &Path,
    split: Split,
    sample: ProblemSample,
) -> Result<Vec<(usize, QaExample)>> {
    let mut all = load_gsm8k_indexed(data_dir, split)?;
    match sample {
        ProblemSample::First(n) => all.truncate(n),
        ProblemSample::Seeded { n, seed } => {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            all.shuffle(&mut rng);
            all.truncate(n);
        }
    }
    Ok(all)
}

/// The first `n` GSM8K validation problems under `data_dir` (held-out figures of a training,
/// the window searches' scores: everything that selects reads these, never the test file).
pub fn validation_problems(data_dir: Option<&Path>, n: usize) -> Result<Vec<QaExample>> {
    if n == 0 {
        return Ok(vec![]);
    }
    Ok(load_gsm8k(&resolve_data_dir(data_dir)?, Split::Validation)?
        .into_iter()
        .take(n)
        .collect())
}
