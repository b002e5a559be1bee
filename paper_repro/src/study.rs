//! The main job: selects the tables, plans the stages, runs them (cached) and writes
//! `OUT/tables.json`, `OUT/README.md` and the plots.

use std::path::PathBuf;

use clap::{Parser, ValueEnum};

use crate::elm_cli::ElmCli;
use crate::error::ReproError;
use crate::rows::BenchFigures;
use crate::runs::{self, Ctx, Variant};
use crate::scale::{Limits, Scale};
use crate::stage::Stages;
use crate::tables::Tables;
use crate::{fill_curves, fill_tables, plots, readme};

/// The study's tables (`--only`).
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum TableId {
    /// Table 1: main results.
    Main,
    /// Table 2: one-step vs multi-step KV.
    Kv,
    /// Table 3: solver × δ ablation.
    Solver,
    /// Table 4: gradient rules.
    Grad,
    /// Table 5: compression sweep.
    Sweep,
    /// Table 6: where to prune (GPPO vs enumeration vs metric selectors).
    Where,
    /// Table 7a: solvers on canonical problems.
    Canonical,
    /// Table 7b: spectral radius of the trained maps.
    Spectral,
    /// Table 8: learning curves (scales with a curve study: `long`, `smoke`).
    Curves,
    /// Table 9: the headline rows at several seeds (same scales).
    Seeds,
    /// Table 10: the collapse diagnosis (scales with collapse starts: `long`, `smoke`, `paper`).
    Collapse,
    /// Table 11: the train-K × test-K grid at the headline window (is the solve worth it?).
    Grid,
}

/// Rebuild the study's tables and plots at one scale.
#[derive(Parser, Debug)]
#[command(name = "paper_repro", version, about)]
pub struct Args {
    #[arg(long, value_enum, default_value = "small")]
    pub scale: Scale,
    /// Output directory (README.md, tables.json, plots/, stages/, work/).
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
    /// Dense model (.gguf or HF directory). Default: the SmolLM2 GGUF in ELM_MODELS_DIR (not for `paper`).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Dataset root (GSM8K under gsm8k/). Default: ELM_DATA_DIR or the repository's data/.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Only these tables (repeatable); the others keep their figures from the last tables.json.
    #[arg(long, value_enum)]
    pub only: Vec<TableId>,
    /// Compute nothing: rewrite README.md, the plots and `--readme`'s block from the last
    /// tables.json (after a change to the writers).
    #[arg(long, conflicts_with_all = ["only", "force"])]
    pub render_only: bool,
    /// Recompute the selected tables' stages (and the trainings they read) instead of reading the cache.
    #[arg(long)]
    pub force: bool,
    /// Path of the `elm` binary. Default: next to this executable.
    #[arg(long)]
    pub elm_bin: Option<PathBuf>,
    /// Also replace the headline block (between `<!-- headline:begin -->` and
    /// `<!-- headline:end -->`) of this file, e.g. the repository's README.md.
    #[arg(long)]
    pub readme: Option<PathBuf>,
    /// The block of `--readme` a `small`/`smoke` run replaces: `<!-- NAME:begin -->` …
    /// `<!-- NAME:end -->` (`headline-gemma3` for the second family; the `long` scale always
    /// writes `long`).
    #[arg(long, default_value = "headline")]
    pub readme_block: String,
    /// Number format of the model commands' large products (f32 or bf16), instead of the
    /// scale's (`small` and `long`: bf16; `smoke` and `paper`: f32). A run in the other format
    /// computes its own stages beside the cached ones.
    #[arg(long)]
    pub precision: Option<elm::gemm::Precision>,
}

/// `target` as a Markdown link from the file `from` (both made absolute): the path from
/// `from`'s folder, with `..` for each folder it must climb.
pub fn relative_link(from: &std::path::Path, target: &std::path::Path) -> String {
    let absolute = |p: &std::path::Path| {
        p.canonicalize().unwrap_or_else(|_| {
            std::env::current_dir()
                .map(|d| d.join(p))
                .unwrap_or_else(|_| p.to_path_buf())
        })
    };
    let from_dir = absolute(from)
        .parent()
        .map(|d| d.to_path_buf())
        .unwrap_or_default();
    let target = absolute(target);
    let (a, b): (Vec<_>, Vec<_>) = (
        from_dir.components().collect(),
        target.components().collect(),
    );
    let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let mut parts: Vec<String> = vec!["..".into(); a.len() - common];
    parts.extend(
        b[common..]
            .iter()
            .map(|c| c.as_os_str().to_string_lossy().into_owned()),
    );
    parts.join("/")
}

/// The `elm` binary: `--elm-bin`, else the one built next to this executable.
fn elm_binary(explicit: Option<PathBuf>) -> Result<PathBuf, ReproError> {
    let bin = match explicit {
        Some(bin) => bin,
        None => std::env::current_exe()
            .map_err(|e| ReproError::Setup(format!("cannot locate this executable: {e}")))?
            .with_file_name(format!("elm{}", std::env::consts::EXE_SUFFIX)),
    };
    if !bin.exists() {
        return Err(ReproError::Setup(format!(
            "elm binary not found at {} (build it: cargo build --release)",
            bin.display()
        )));
    }
    Ok(bin)
}

/// The tables that read the dense model's runs: every one but the canonical problems (each cuts
/// compressed models from the LoRA-tuned dense model or compares with it).
const NEEDS_DENSE: [TableId; 11] = [
    TableId::Main,
    TableId::Grid,
    TableId::Collapse,
    TableId::Curves,
    TableId::Seeds,
    TableId::Kv,
    TableId::Solver,
    TableId::Grad,
    TableId::Sweep,
    TableId::Where,
    TableId::Spectral,
];

/// The second M of table 3 (the paper's M for its "38.6% less computation" figure).
const SOLVER_DEEP_M: usize = 14;

/// Planned work units of the selected tables (the ETA's denominator; see `runs`).
pub fn plan_units(l: &Limits, sel: &dyn Fn(TableId) -> bool) -> f64 {
    let train = |b: &crate::scale::Budget| b.max_tokens() as f64 / 100.0;
    let nll = l.nll_eval as f64 * 2.0;
    // The ablation tables' smaller test sample.
    let anll = l.ablation_nll_eval.min(l.nll_eval) as f64 * 2.0;
    let em = (l.gsm8k_eval * l.max_new_tokens) as f64 / 5.0;
    let prune = l.calibration_tokens as f64 / 50.0;
    let mut u = if l.bench { 60.0 } else { 0.0 };
    if NEEDS_DENSE.iter().any(|&t| sel(t)) {
        // Untuned and LoRA-tuned dense evaluations and the LoRA run.
        u += 2.0 * (nll + em) + anll + train(&l.lora);
    }
    if sel(TableId::Main) || sel(TableId::Curves) || sel(TableId::Seeds) {
        // ELM, Streamline, looped, the ELM at the best healed baseline's window, the ELM's two
        // ablations and (where the scale has them) Streamline FFN, ELM + heal and the two
        // LaCo-merged inits; the healing fine-tunes.
        // The controls: two fixed-depth trainings, the Relaxed Recursive Transformer and one
        // more healed baseline (M − 1); every baseline also scored on validation.
        let trainings =
            9.0 + if l.extra_rows { 2.0 } else { 0.0 } + if l.la_co_init_rows { 2.0 } else { 0.0 };
        let val = l.validation_eval as f64 * 2.0;
        u += trainings * (train(&l.main) + nll + em)
            + l.baselines.len() as f64 * (prune + nll + em + val)
            + (l.healed.len() + 1) as f64 * (train(&l.lora) + nll + em + val);
        // Table 1b: the headline ELM, the tuned dense model, the best healed baseline and the
        // four controls on the whole test set.
        if let Some(n) = l.full_test {
            u += 7.0 * n as f64 * 2.0;
        }
    } else if sel(TableId::Solver) || sel(TableId::Grad) || sel(TableId::Spectral) {
        u += train(&l.main);
    }
    if sel(TableId::Solver) {
        let ms = if l.sweep.contains(&SOLVER_DEEP_M) && l.m != SOLVER_DEEP_M {
            2.0
        } else {
            1.0
        };
        u += ms * l.tolerances.len() as f64 * 3.0 * anll;
    }
    if sel(TableId::Grad) {
        u += 4.0 * (train(&l.study) + anll);
    }
    if sel(TableId::Sweep) || sel(TableId::Kv) || sel(TableId::Spectral) {
        u += l.sweep.len() as f64 * (train(&l.study) + anll + prune + anll);
    }
    if sel(TableId::Kv) {
        u += l.kv_ms.len() as f64 * (2.0 * l.max_new_tokens as f64 / 5.0 + 2.0 * em);
    }
    if sel(TableId::Where) {
        if let Some(every) = l.trained_starts_every {
            // Every start trained at the main budget and scored on validation.
            let starts = (23 / every.max(1) + 1) as f64;
            u += starts * (train(&l.main) + l.validation_eval as f64 * 2.0);
        }
        let b = &l.search;
        let windows = 23.0 / b.enum_every as f64;
        u += (b.gppo_steps * b.seq_len) as f64 / 100.0
            + windows * (b.enum_steps * b.seq_len) as f64 / 100.0
            + prune;
    }
    if let Some(c) = &l.curves {
        let per_point = |steps: usize| {
            // A trained module, a heal and a LoRA run cost about the same per token here.
            l.main.with_steps(steps).max_tokens() as f64 / 100.0 + nll
        };
        let fresh = |budgets: &[usize]| {
            budgets
                .iter()
                .filter(|&&n| n != l.main.steps)
                .map(|&n| per_point(n))
                .sum::<f64>()
        };
        if sel(TableId::Curves) {
            // ELM at two windows, the healed baselines, Streamline and the dense reference;
            // three of them (the headline series) also at the larger budgets.
            let series = 3 + l.healed.len();
            u += series as f64 * fresh(&c.steps) + 3.0 * fresh(&c.headline_steps);
        }
        if sel(TableId::Seeds) {
            u += 3.0 * (c.seeds.len() - 1) as f64 * per_point(l.main.steps);
        }
    }
    if sel(TableId::Canonical) {
        u += 5.0;
    }
    if sel(TableId::Grid) {
        // Its trainings; each trained module tested at every depth on validation and the
        // ablation sample, weighted by its block evaluations (a solved cell counted as 16).
        let g = l.grid.clone().unwrap_or_else(crate::scale::GridSizes::full);
        let models = (g.train_ks.len() + 1) as f64;
        let depths: usize = g.test_ks.iter().sum::<usize>() + 16 * g.test_tols.len();
        let per_eval = (l.validation_eval as f64 + anll / 2.0) * 2.0;
        u += models * train(&l.main) + models * per_eval * (depths as f64 / 8.0);
    }
    if sel(TableId::Collapse) {
        let spectral = l.spectral_sequences as f64 * 10.0;
        u += 2.0 * l.collapse_starts.len() as f64 * (train(&l.main) + anll + spectral);
    }
    if sel(TableId::Spectral) {
        u += (1 + l.sweep.len()) as f64 * l.spectral_sequences as f64 * 10.0 + 1.0;
    }
    u
}

pub fn run(args: Args) -> Result<(), ReproError> {
    let elm_bin = elm_binary(args.elm_bin)?;
    let model = match (args.model, args.scale) {
        (Some(m), _) => m,
        (None, Scale::Paper) => return Err(ReproError::Setup(
            "--scale paper needs --model pointing at a local HF directory of Qwen2.5-1.5B-Instruct"
                .into(),
        )),
        (None, _) => elm::model::default_model_path(),
    };
    if !model.exists() {
        return Err(ReproError::Setup(format!(
            "model not found: {} (run scripts/fetch-smollm2.sh)",
            model.display()
        )));
    }
    let data_dir = elm::data::resolve_data_dir(args.data_dir.as_deref())
        .map_err(|e| ReproError::Setup(e.to_string()))?;
    let out = args.out;
    std::fs::create_dir_all(&out).map_err(|e| ReproError::io(&out, e))?;
    let out = out.canonicalize().map_err(|e| ReproError::io(&out, e))?;
    // One paper_repro per results directory for the whole run (its stages and README).
    let command: Vec<String> = std::env::args().collect();
    // Its stages are content-addressed: an earlier run's results are reused, never refused.
    let run =
        elm::io::RunDir::lock(&out, elm::io::OpenMode::Reuse, &command.join(" ")).map_err(|e| {
            ReproError::Elm {
                what: "results directory".into(),
                source: e,
            }
        })?;
    if let Some(note) = run.takeover_note() {
        eprintln!("{note}");
    }
    let model_config = elm::model::load_config(&model).map_err(|e| ReproError::Elm {
        what: format!("model config of {}", model.display()),
        source: e,
    })?;
    let mut limits = args.scale.limits().for_layers(model_config.num_layers);
    if let Some(p) = args.precision {
        limits.precision = p;
    }
    // Refused here rather than by the first training, minutes in.
    elm::gemm::set_precision(limits.precision)
        .map_err(|e| ReproError::Setup(format!("{e} (pass --precision f32 to paper_repro)")))?;
    let elm = ElmCli::new(elm_bin).with_precision(limits.precision);
    let only = args.only.clone();
    // Table 10 is not part of `small`'s 90 minutes; asked for by name it runs there too, at
    // `long`'s starts.
    if only.contains(&TableId::Collapse) && limits.collapse_starts.is_empty() {
        limits.collapse_starts = Scale::Long
            .limits()
            .for_layers(model_config.num_layers)
            .collapse_starts;
    }
    let has_collapse = !limits.collapse_starts.is_empty();
    let has_curves = limits.curves.is_some();
    // Asked for by name, the grid runs at any scale.
    let has_grid = limits.grid.is_some() || only.contains(&TableId::Grid);
    if !has_curves
        && only
            .iter()
            .any(|t| matches!(t, TableId::Curves | TableId::Seeds))
    {
        return Err(ReproError::Setup(format!(
            "--scale {} has no learning curves or seeds (tables 8 and 9): use --scale long",
            format!("{:?}", args.scale).to_lowercase()
        )));
    }
    let render_only = args.render_only;
    let sel = move |t: TableId| {
        !render_only
            && (only.is_empty() || only.contains(&t))
            && (has_curves || !matches!(t, TableId::Curves | TableId::Seeds))
            && (has_collapse || t != TableId::Collapse)
            && (has_grid || t != TableId::Grid)
    };
    let stages = Stages::at_precision(
        &out,
        args.force,
        plan_units(&limits, &sel),
        limits.precision,
    )?;
    let mut ctx = Ctx {
        elm: &elm,
        stages,
        model_id: runs::file_identity(&model),
        model: model.clone(),
        data_dir: data_dir.clone(),
        limits: &limits,
        teacher_cache: out.join("teacher_cache"),
        model_name: runs::model_name(&model),
        ffn_blocks: !model_config.has_gemma_norms(),
        num_layers: model_config.num_layers,
        // The paper's absolute MSE on SmolLM2 (held-out MSE ≈ 15 after training, CE ≈ 2: the
        // terms are of a size). Gemma 3's stream is far larger (its embedding is scaled by √C;
        // MSE ≈ 5e4 at the first step), which would leave the CE term without effect: there the
        // MSE is taken relative to the teacher's mean square. The README's Gemma section says so.
        distill_scale: if model_config.has_gemma_norms() {
            elm::equilibrium::DistillScale::TeacherMeanSquare
        } else {
            elm::equilibrium::DistillScale::Absolute
        },
    };
    let scale = format!("{:?}", args.scale).to_lowercase();
    // Tables not selected keep their rows from the previous run.
    let tables_path = out.join("tables.json");
    let previous: Option<Tables> = std::fs::read_to_string(&tables_path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .filter(|t: &Tables| t.scale == scale);
    // The model by its file name and SHA-256, not by this machine's path: what a reader can
    // fetch and check (an HF directory: its weights file's digest).
    let label = model.file_name().map_or_else(
        || model.display().to_string(),
        |f| f.to_string_lossy().into_owned(),
    );
    let mut t = previous.unwrap_or_else(|| Tables::empty(scale.clone(), label.clone()));
    t.model = label;
    let weights_file = if model.is_dir() {
        model.join("model.safetensors")
    } else {
        model.clone()
    };
    t.model_sha256 = elm::io::sha256_file(&weights_file).ok();
    t.limits = serde_json::to_value(&limits).map_err(|e| ReproError::Setup(e.to_string()))?;
    // What the reference solutions call for as a generation budget (validation split, this
    // model's tokens): the README sets the exact-match figures beside it.
    let tokenizer = elm::model::load_tokenizer(&model).map_err(|e| ReproError::Elm {
        what: format!("tokenizer of {}", model.display()),
        source: e,
    })?;
    let references = elm::data::load_gsm8k(&data_dir, elm::data::Split::Validation)
        .map_err(|e| ReproError::Setup(format!("GSM8K validation split: {e}")))?;
    let generation_budget = elm::eval::gsm8k::reference_token_budget(
        &tokenizer,
        &references,
        elm::eval::gsm8k::REFERENCE_BUDGET_QUANTILE,
    )
    .map_err(|e| ReproError::Elm {
        what: "generation budget".into(),
        source: e,
    })?;
    t.limits["generation_budget"] =
        serde_json::to_value(&generation_budget).map_err(|e| ReproError::Setup(e.to_string()))?;
    // The distillation recipe of every ELM training of the run (the model family decides it).
    t.limits["distill_scale"] =
        serde_json::to_value(ctx.distill_scale).map_err(|e| ReproError::Setup(e.to_string()))?;
    let mut trainings = vec![];

    if limits.bench && !render_only {
        let b = crate::bench::run(&mut ctx)?;
        t.bench = Some(BenchFigures::from(&b));
    }
    let needs = |ids: &[TableId]| ids.iter().any(|&i| sel(i));
    // Every table but the canonical problems cuts compressed models, and (as in the paper)
    // they are cut from the LoRA-tuned dense model: tune it first, then point every later
    // stage at it (the untuned model's runs are already done by then).
    let dense = if needs(&NEEDS_DENSE) {
        let d = fill_tables::dense(&mut ctx)?;
        ctx.model = d.tuned.value.out.clone().into();
        ctx.model_id = format!("lora-tuned {}", d.tuned.key);
        Some(d)
    } else {
        None
    };
    let mut best_baseline = None;
    let main_elm = if needs(&[TableId::Main, TableId::Curves, TableId::Seeds]) {
        // Tables 8 and 9 read table 1's windows and ranking (its stages are cached).
        let d = dense.as_ref().expect("dense runs for the main table");
        let m = fill_tables::main_results(&mut ctx, d)?;
        if sel(TableId::Seeds) {
            t.seeds = Some(fill_curves::seeds(&mut ctx, d, &m)?);
        }
        if sel(TableId::Curves) {
            t.curves = Some(fill_curves::curves(&mut ctx, d, &m)?);
        }
        t.main = m.rows;
        t.same_window = m.same_window;
        t.healed_elm = m.healed_elm;
        t.controls = Some(m.controls);
        t.full_test = m.full_test;
        best_baseline = Some(m.best_baseline);
        trainings.extend(m.trainings);
        Some(m.elm)
    } else if needs(&[TableId::Solver, TableId::Grad, TableId::Spectral]) {
        let e = runs::train(
            &mut ctx,
            &Variant::elm(limits.start, limits.m),
            &limits.main,
            None,
        )?;
        trainings.push((format!("ELM M={} (main)", limits.m), e.clone_done()));
        Some(e)
    } else {
        None
    };
    if sel(TableId::Solver) {
        let (d, e) = (
            dense.as_ref().expect("dense"),
            main_elm.as_ref().expect("main ELM"),
        );
        t.solver = fill_tables::solver_ablation(&mut ctx, d, e)?;
        t.precision_check = match limits.precision {
            elm::gemm::Precision::F32 => vec![],
            elm::gemm::Precision::Bf16 => fill_tables::precision_check(&mut ctx, d, e)?,
        };
    }
    if sel(TableId::Grad) {
        let (d, e) = (
            dense.as_ref().expect("dense"),
            main_elm.as_ref().expect("main ELM"),
        );
        let (rows, tr) = fill_tables::grad_ablation(&mut ctx, d, e)?;
        t.grad = rows;
        trainings.extend(tr);
    }
    let sweep_elms = if needs(&[TableId::Sweep, TableId::Kv, TableId::Spectral]) {
        let baseline = match (&best_baseline, &dense) {
            (Some(b), _) => b.clone(),
            (None, Some(d)) => fill_tables::best_baseline(&mut ctx, d)?,
            (None, None) => limits.baselines[0].to_string(),
        };
        if sel(TableId::Sweep) {
            let d = dense.as_ref().expect("dense");
            let (rows, elms) = fill_tables::sweep(&mut ctx, d, &baseline)?;
            t.sweep = rows;
            elms
        } else {
            let mut elms = vec![];
            for &m in &limits.sweep {
                elms.push((
                    m,
                    runs::train(
                        &mut ctx,
                        &Variant::elm(limits.start, m),
                        &limits.study,
                        None,
                    )?,
                ));
            }
            elms
        }
    } else {
        vec![]
    };
    for (m, e) in &sweep_elms {
        trainings.push((format!("ELM M={m} (ablation budget)"), e.clone_done()));
    }
    // Table 3 also at M = 14, the paper's setting for its Anderson saving (where ρ is larger):
    // the sweep's ELM there, at the ablation budget.
    if sel(TableId::Solver) {
        if let Some((_, e)) = sweep_elms
            .iter()
            .find(|(m, _)| *m == SOLVER_DEEP_M && *m != limits.m)
        {
            let d = dense.as_ref().expect("dense");
            t.solver
                .extend(fill_tables::solver_ablation(&mut ctx, d, e)?);
        }
    }
    if sel(TableId::Kv) {
        let dir = elm::data::gsm8k_path(&data_dir, elm::data::Split::Test);
        let q = elm::data::load_gsm8k(&data_dir, elm::data::Split::Test)
            .map_err(|e| ReproError::Setup(format!("{}: {e}", dir.display())))?
            .into_iter()
            .next()
            .ok_or_else(|| ReproError::Setup(format!("{}: no problem", dir.display())))?;
        t.kv = fill_tables::kv_ablation(&mut ctx, &sweep_elms, &q.question)?;
    }
    if sel(TableId::Where) {
        let d = dense.as_ref().expect("dense");
        let (w, dir) = runs::where_to_prune(&mut ctx, &d.tuned, limits.m)?;
        let plots = out.join("plots");
        std::fs::create_dir_all(&plots).map_err(|e| ReproError::io(&plots, e))?;
        let (from, to) = (
            dir.join("where_to_prune.svg"),
            plots.join("where_to_prune.svg"),
        );
        std::fs::copy(&from, &to).map_err(|e| ReproError::io(&from, e))?;
        t.trained_windows =
            fill_tables::trained_windows(&mut ctx, &t.main, t.same_window.as_ref(), &w.value)?;
        t.fully_trained = match limits.trained_starts_every {
            Some(every) => Some(fill_tables::fully_trained(&mut ctx, &w.value, every)?),
            None => None,
        };
        t.where_to_prune = Some(w.value);
    }
    if sel(TableId::Grid) {
        // The headline window: this run's table 1, else the last run's, else the study's.
        let start = t.controls.as_ref().map_or(limits.start, |c| c.layers.0);
        let sizes = limits
            .grid
            .clone()
            .unwrap_or_else(crate::scale::GridSizes::full);
        t.grid = Some(crate::fill_grid::grid(&mut ctx, start, &sizes)?);
    }
    if sel(TableId::Collapse) && !limits.collapse_starts.is_empty() {
        let d = dense.as_ref().expect("dense");
        t.collapse = fill_tables::collapse(&mut ctx, d)?;
    }
    if sel(TableId::Canonical) {
        let elm_ref = ctx.elm;
        let plots = out.join("plots");
        std::fs::create_dir_all(&plots).map_err(|e| ReproError::io(&plots, e))?;
        let c = ctx.stages.run::<_, crate::solvers::Canonical>(
            "canonical",
            &serde_json::json!({"problems": 6}),
            5.0,
            |_| runs::to_value(&crate::solvers::run(elm_ref, &plots)?),
        )?;
        t.canonical = c.value.rows;
    }
    if sel(TableId::Spectral) {
        let mut models: Vec<(String, usize, &crate::stage::Done<runs::Trained>)> = vec![];
        if let Some(e) = &main_elm {
            models.push((format!("ELM M={} (main budget)", limits.m), limits.m, e));
        }
        for (m, e) in &sweep_elms {
            if models.iter().all(|(_, _, d)| d.key != e.key) {
                models.push((format!("ELM M={m} (ablation budget)"), *m, e));
            }
        }
        t.spectral = fill_tables::spectral(&mut ctx, &models)?;
        // Where the trained maps sit on the canonical problem's ρ axis (when acceleration pays).
        let marks: Vec<(String, f64)> = t
            .spectral
            .iter()
            .map(|r| (r.model.clone(), r.mean_radius))
            .collect();
        t.rho_sweep = Some(runs::rho_sweep(&mut ctx, &marks, &out.join("plots"))?.value);
    }
    if !trainings.is_empty() {
        // One row per distinct training (the sweep's M = main M may be the gradient study's SJFB run).
        let mut seen = std::collections::BTreeSet::new();
        trainings.retain(|(_, d)| seen.insert(d.key.clone()));
        t.speed = fill_tables::speed_rows(&trainings);
    }
    // A run of some tables (`--only`) keeps the other tables' stages in the record, so that the
    // README's compute time stays that of every table it shows.
    // A rendering computes nothing: the record of the last invocation stays as it was.
    let kept: Vec<_> = if render_only {
        std::mem::take(&mut t.stages)
    } else if args.only.is_empty() {
        vec![]
    } else {
        let now: std::collections::BTreeSet<&String> =
            ctx.stages.log.iter().map(|s| &s.key).collect();
        t.stages
            .iter()
            .filter(|s| !now.contains(&s.key))
            .map(|s| crate::stage::StageLog {
                // Computed by an earlier invocation: this one read nothing of it.
                cached: true,
                ..s.clone()
            })
            .collect()
    };
    t.stages = kept
        .into_iter()
        .chain(ctx.stages.log.iter().cloned())
        .collect();
    if !render_only {
        t.seconds = ctx.stages.elapsed();
    }
    elm::io::write_json_atomic(&tables_path, &t)
        .map_err(|e| ReproError::writing(&tables_path, e))?;
    let written = plots::write(&t, &out.join("plots"))?;
    let mut page = readme::readme(&t, &written);
    // The main job's page also carries the tables that read several runs: its `long` run and
    // the second family's (`OUT/long`, `OUT/gemma3`), where they have been run.
    let companion = |dir: &str| -> Option<Tables> {
        let text = std::fs::read_to_string(out.join(dir).join("tables.json")).ok()?;
        serde_json::from_str(&text).ok()
    };
    if args.scale != Scale::Long {
        let (long, second) = (companion("long"), companion("gemma3"));
        let cross = crate::claims::sections(&t, long.as_ref(), second.as_ref());
        if !cross.is_empty() {
            page = page.replacen("## Table 1 — ", &format!("{cross}## Table 1 — "), 1);
        }
    }
    let readme_path = out.join("README.md");
    elm::io::write_atomic(&readme_path, page.as_bytes())
        .map_err(|e| ReproError::writing(&readme_path, e))?;
    if let Some(path) = &args.readme {
        let text = std::fs::read_to_string(path).map_err(|e| ReproError::io(path, e))?;
        // The run's page as the block's file links to it (`results/README.md` from the
        // repository's README, `../results/long/README.md` from `docs/study.md`).
        let link = relative_link(path, &out.join("README.md"));
        // `long` writes its own block; the headline stays the main job's.
        let (begin, end, block) = if args.scale == Scale::Long {
            (
                readme::LONG_BEGIN.to_string(),
                readme::LONG_END.to_string(),
                readme::long_block(&t, &link),
            )
        } else {
            let (begin, end) = readme::block_markers(&args.readme_block);
            let block = readme::headline_block(&t, &link, &args.readme_block);
            (begin, end, block)
        };
        let updated = readme::replace_block(&text, &begin, &end, &block).ok_or_else(|| {
            ReproError::Setup(format!(
                "{}: no `{begin}` … `{end}` block to replace",
                path.display()
            ))
        })?;
        elm::io::write_atomic(path, updated.as_bytes())
            .map_err(|e| ReproError::writing(path, e))?;
    }
    eprintln!(
        "{} {} and {} ({})",
        if render_only { "rendered" } else { "wrote" },
        readme_path.display(),
        tables_path.display(),
        if render_only {
            "nothing computed".to_string()
        } else {
            format!("in {}", crate::stage::seconds(t.seconds))
        }
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::relative_link;
    use std::path::Path;

    #[test]
    fn links_climb_out_of_the_block_file_folder() {
        let root = std::env::temp_dir().join("elm-relative-link");
        assert_eq!(
            relative_link(&root.join("README.md"), &root.join("results/README.md")),
            "results/README.md"
        );
        assert_eq!(
            relative_link(
                &root.join("docs/study.md"),
                &root.join("results/long/README.md")
            ),
            "../results/long/README.md"
        );
        assert_eq!(
            relative_link(Path::new("/a/b/c.md"), Path::new("/x/y.md")),
            "../../x/y.md"
        );
    }
}
