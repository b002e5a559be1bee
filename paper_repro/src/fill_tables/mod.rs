//! Tables 1–7 filled from the cached stages of [`crate::runs`]: each function runs (or reads)
//! the stages one table needs and turns their reports into the rows of [`crate::rows`]. Every
//! number is a measurement or the library's own computation on measurements (paired
//! intervals); this file owns no statistics of its own.

use elm::eval::stats::{paired, BootstrapConfig, PairedComparison};
use elm::eval::task::MetricReport;
use elm::eval::TaskRun;
use elm::grad::{DeqConfig, GradientRule};
use elm::lora::LoraReport;
use elm::search::report::WhereToPrune;
use elm::solver::{SolverConfig, StopCriteria};

use crate::error::ReproError;
use crate::rows::{
    CollapseRow, Control, ControlKind, Controls, FullTest, FullTestRow, FullyTrained, GradRow,
    HealedElm, Interval, KvRow, MainRow, PrecisionRow, SameWindow, SolverRow, SpectralRow,
    SpeedRow, SweepRow, TrainedPlacement, TrainedStart, TrainedWindow, MAIN_ELM_ROW,
    REFERENCE_KIND,
};
use crate::runs::{self, Ctx, Metrics, OwnCompute, Problems, Subject, Trained, Variant};
use crate::stage::Done;

mod ablations;

pub use ablations::*;

/// Named trainings of a run (for the throughput table).
pub type Trainings = Vec<(String, Done<Trained>)>;
/// Trained ELMs by replaced layers M.
pub type ElmsByM = Vec<(usize, Done<Trained>)>;

/// `model`'s per-problem scores against `reference`'s over the same problems: the library's
/// paired bootstrap (Δ and ratio intervals); `what` names the pair in an error.
fn pair(
    model: &MetricReport,
    reference: &MetricReport,
    what: &str,
) -> Result<PairedComparison, ReproError> {
    paired(&model.items, &reference.items, &BootstrapConfig::default()).map_err(|source| {
        ReproError::Elm {
            what: what.to_string(),
            source,
        }
    })
}

/// `model`'s score minus `reference`'s, paired over the same problems (the interval of every Δ
/// and gap the tables print).
pub(crate) fn paired_delta(
    model: &MetricReport,
    reference: &MetricReport,
    what: &str,
) -> Result<Interval, ReproError> {
    Ok((&pair(model, reference, what)?.delta).into())
}

/// The dense model's runs. `nll` / `em` are the LoRA-tuned model's, the reference of every
/// Δ and RP: the compressed models are trained on GSM8K, so only a dense model tuned with the
/// same token budget says how much of it they keep (the untuned model is a row of its own).
pub struct Dense {
    pub nll: Done<TaskRun>,
    /// The tuned model on the ablation tables' smaller test sample (their Δ's reference).
    pub ablation_nll: Done<TaskRun>,
    pub em: Done<TaskRun>,
    pub tuned: Done<LoraReport>,
    pub untuned_nll: Done<TaskRun>,
    pub untuned_em: Done<TaskRun>,
    /// The untuned model and its identity (the LoRA runs of the learning curves start there).
    pub untuned_model: std::path::PathBuf,
    pub untuned_id: String,
}

pub fn dense(ctx: &mut Ctx<'_>) -> Result<Dense, ReproError> {
    let untuned_nll = runs::eval(ctx, &Subject::Dense, "gsm8k-nll")?;
    let untuned_em = runs::eval(ctx, &Subject::Dense, "gsm8k")?;
    let budget = ctx.limits.lora;
    let (untuned_model, untuned_id) = (ctx.model.clone(), ctx.model_id.clone());
    let tuned = runs::lora(ctx, &untuned_model, &untuned_id, &budget)?;
    let subject = Subject::tuned(&tuned);
    Ok(Dense {
        nll: runs::eval(ctx, &subject, "gsm8k-nll")?,
        ablation_nll: runs::eval_on(ctx, &subject, "gsm8k-nll", Problems::AblationTest)?,
        em: runs::eval(ctx, &subject, "gsm8k")?,
        tuned,
        untuned_nll,
        untuned_em,
        untuned_model,
        untuned_id,
    })
}

/// A trained ELM (Anderson, δ = 0.5) on the ablation tables' test sample.
fn ablation_nll(ctx: &mut Ctx<'_>, t: &Done<Trained>) -> Result<Done<TaskRun>, ReproError> {
    runs::eval_on(
        ctx,
        &Subject::elm(t, "anderson", 0.5),
        "gsm8k-nll",
        Problems::AblationTest,
    )
}

/// Answer NLL and its paired Δ vs dense of one NLL run on the ablation tables' test sample.
fn nll_cells(run: &TaskRun, dense: &Dense, what: &str) -> Result<(Interval, Interval), ReproError> {
    let m = run.metric("answer_nll", what)?;
    let d = dense.ablation_nll.value.metric("answer_nll", "dense")?;
    Ok(((&m.estimate).into(), paired_delta(m, d, what)?))
}

/// Table 1 rows (and the trained ELM, reused by tables 3 and 7).
pub struct Main {
    pub rows: Vec<MainRow>,
    pub elm: Done<Trained>,
    /// The training-free method with the lowest answer NLL at M (the sweep's baseline).
    pub best_baseline: String,
    pub trainings: Vec<(String, Done<Trained>)>,
    pub same_window: Option<SameWindow>,
    /// First replaced layer of the ELM trained at the best healed baseline's window.
    pub same_window_start: Option<usize>,
    /// The healed baselines (`elm prune --method` names), best answer NLL first.
    pub healed_ranked: Vec<String>,
    pub healed_elm: Option<HealedElm>,
    pub controls: Controls,
    /// Table 1b (scales with `Limits::full_test`).
    pub full_test: Option<FullTest>,
}

/// The healing fine-tune of a pruned model (the LoRA budget) and its test evaluations (answer
/// NLL, and exact match where `exact_match` says).
fn heal_and_eval(
    ctx: &mut Ctx<'_>,
    pruned: &Done<runs::Pruned>,
    exact_match: ExactMatch,
) -> Result<Healed, ReproError> {
    let budget = ctx.limits.lora;
    let run = runs::heal(ctx, pruned, &budget)?;
    let subject = Subject::tuned(&run);
    let nll = runs::eval(ctx, &subject, "gsm8k-nll")?;
    let em = match exact_match {
        ExactMatch::Scored => Some(runs::eval(ctx, &subject, "gsm8k")?),
        ExactMatch::Skipped => None,
    };
    Ok(Healed {
        run,
        subject,
        nll,
        em,
    })
}

/// Whether a table-1 row gets an exact-match evaluation: the rows the headline reads by EM do
/// (the dense rows, the ELMs, the healed baselines); the others (training-free baselines,
/// Streamline, looped, the ELM's ablations, ELM + heal, the three controls, which the verdict
/// reads by their paired NLL) are ranked by answer NLL alone, since at 135M no EM interval
/// separates compressed models.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ExactMatch {
    Scored,
    Skipped,
}

/// A healed baseline: its LoRA run, the merged model and its two test evaluations.
struct Healed {
    run: Done<LoraReport>,
    subject: Subject,
    nll: Done<TaskRun>,
    em: Option<Done<TaskRun>>,
}

pub fn main_results(ctx: &mut Ctx<'_>, dense: &Dense) -> Result<Main, ReproError> {
    let l = ctx.limits.clone();
    let dn = dense.nll.value.metric("answer_nll", "dense")?;
    let df = dense.em.value.metric("flexible_extract", "dense")?;
    let dense_params = |t: &Trained| {
        (
            t.compress.params.dense_total,
            t.compress.params.dense_non_embedding,
            t.compress.kv.dense * 1024 / t.compress.kv.context.max(1),
        )
    };
    let mut rows = vec![];
    let row = |model: String,
               kind: &str,
               p: (usize, usize, usize),
               cost: (usize, f64),
               nll: &TaskRun,
               em: Option<&TaskRun>|
     -> Result<MainRow, ReproError> {
        let n = nll.metric("answer_nll", &model)?;
        let f = em
            .map(|em| em.metric("flexible_extract", &model))
            .transpose()?;
        let strict = em.map(|em| em.metric("strict_match", &model)).transpose()?;
        let is_reference = kind == REFERENCE_KIND;
        Ok(MainRow {
            model: model.clone(),
            kind: kind.into(),
            params: p.0,
            non_embedding_params: p.1,
            kv_bytes_1k: p.2,
            train_tokens: cost.0,
            train_seconds: cost.1,
            answer_nll: (&n.estimate).into(),
            delta_nll: if is_reference {
                None
            } else {
                Some(paired_delta(n, dn, &model)?)
            },
            flexible_em: f.map(|f| (&f.estimate).into()),
            strict_em: strict.map(|m| (&m.estimate).into()),
            // Runs from before the metric existed have none: "not recorded".
            truncated: em
                .and_then(|em| em.metrics.get("truncated"))
                .map(|m| (&m.estimate).into()),
            rp_flexible: match f {
                Some(f) if !is_reference => pair(f, df, &model)?.ratio.as_ref().map(Into::into),
                _ => None,
            },
            delta_nll_vs_elm: None,
        })
    };
    // The ELM first (its training fills the teacher cache the trained baselines then read),
    // each trained model evaluated right after its training so that a partial run already
    // has the headline; rows keep the table's order.
    let trained_row = |ctx: &mut Ctx<'_>,
                       name: String,
                       kind: &str,
                       t: &Done<Trained>,
                       exact_match: ExactMatch|
     -> Result<(MainRow, MetricReport), ReproError> {
        let s = Subject::elm(t, "anderson", 0.5);
        let nll = runs::eval(ctx, &s, "gsm8k-nll")?;
        let em = match exact_match {
            ExactMatch::Scored => Some(runs::eval(ctx, &s, "gsm8k")?),
            ExactMatch::Skipped => None,
        };
        let kv1k = t.value.kv_bytes_1k();
        let items = nll.value.metric("answer_nll", &name)?.clone();
        let r = row(
            name,
            kind,
            (
                t.value.compress.params.elm_total,
                t.value.compress.params.elm_non_embedding,
                kv1k,
            ),
            (l.main.max_tokens(), t.value.compute_seconds()),
            &nll.value,
            em.as_ref().map(|e| &e.value),
        )?;
        Ok((r, items))
    };
    let budget = format!(
        "trained, {} steps × {} × {} tokens",
        l.main.steps, l.main.batch_size, l.main.seq_len
    );
    let elm = runs::train(ctx, &Variant::elm(l.start, l.m), &l.main, None)?;
    let elm_row = trained_row(
        ctx,
        MAIN_ELM_ROW.into(),
        &format!("ELM, {budget}"),
        &elm,
        ExactMatch::Scored,
    )?;
    let streamline = runs::train(ctx, &Variant::streamline(l.start, l.m), &l.main, None)?;
    let streamline_row = trained_row(
        ctx,
        "LLM-Streamline (1 layer, 1 application)".into(),
        &budget,
        &streamline,
        ExactMatch::Skipped,
    )?;
    // A family without feed-forward-only module blocks (Gemma 3) has no FFN row; `small`
    // leaves it out (`Limits::extra_rows`).
    let streamline_ffn = if ctx.ffn_blocks && l.extra_rows {
        Some(runs::train(
            ctx,
            &Variant::streamline_ffn(l.start, l.m),
            &l.main,
            None,
        )?)
    } else {
        None
    };
    let streamline_ffn_row = match &streamline_ffn {
        Some(t) => Some(trained_row(
            ctx,
            "LLM-Streamline FFN (layer l's MLP alone, 1 application)".into(),
            &budget,
            t,
            ExactMatch::Skipped,
        )?),
        None => None,
    };
    let looped = runs::train(
        ctx,
        &Variant::looped(l.start, l.m, l.looped_k),
        &l.main,
        None,
    )?;
    let looped_row = trained_row(
        ctx,
        format!("looped block (K = {}, no injection)", l.looped_k),
        &budget,
        &looped,
        ExactMatch::Skipped,
    )?;
    rows.push(row(
        format!(
            "{}, LoRA-tuned (r = {}, {} steps × {} × {} tokens; the reference)",
            ctx.model_name,
            elm::lora::LoraSpec::default().rank,
            l.lora.steps,
            l.lora.batch_size,
            l.lora.seq_len
        ),
        REFERENCE_KIND,
        dense_params(&elm.value),
        (l.lora.max_tokens(), dense.tuned.value.compute_seconds()),
        &dense.nll.value,
        Some(&dense.em.value),
    )?);
    rows.push(row(
        format!("{} (untuned)", ctx.model_name),
        "dense, untuned",
        dense_params(&elm.value),
        (0, 0.0),
        &dense.untuned_nll.value,
        Some(&dense.untuned_em.value),
    )?);
    // Table 1b's rows besides the headline ELM: (row name, role, what to score).
    let mut full_test_rows: Vec<(String, String, Subject)> = vec![(
        rows[0].model.clone(),
        "reference: the LoRA-tuned dense model".into(),
        Subject::tuned(&dense.tuned),
    )];
    // Per-problem answer NLL of each compressed row, paired with the ELM's below.
    let mut compressed: Vec<(usize, MetricReport)> = vec![];
    // Every "best" below is chosen on the validation split (`best_on_validation`).
    let mut baseline_scores = vec![];
    let mut to_heal = vec![];
    for method in &l.baselines {
        let p = runs::prune(ctx, method, l.m)?;
        let subject = Subject::pruned(&p);
        let nll = runs::eval(ctx, &subject, "gsm8k-nll")?;
        baseline_scores.push((runs::validation_nll(ctx, &subject)?, method.to_string()));
        compressed.push((rows.len(), nll.value.metric("answer_nll", method)?.clone()));
        let shape = (
            p.value.report.params,
            p.value.report.non_embedding_params,
            p.value.report.kv_bytes_1k,
        );
        rows.push(row(
            format!("{method} (layers {:?})", p.value.report.removed_layers),
            "training-free",
            shape,
            (0, p.value.report.seconds),
            &nll.value,
            None,
        )?);
        if l.healed.contains(method) {
            to_heal.push((method, p, shape));
        }
    }
    // The healing fine-tunes after every training-free row, so that a partial run already
    // has those rows.
    // The LoRA budget: the ELM's (`main`) at every scale but smoke, whose 32-token sequences
    // hold no answer token to tune on.
    // The best healed baseline's window, when it is one window (method against method, not
    // window against window: its row is compared with an ELM trained at the same layers).
    let mut window_candidates = vec![];
    let mut healed_ranked: Vec<(f64, String)> = vec![];
    for (method, p, shape) in to_heal {
        let Healed {
            run: healed,
            subject,
            nll,
            em,
        } = heal_and_eval(ctx, &p, ExactMatch::Scored)?;
        let name = format!(
            "{method} + LoRA healing (r = {}, α = 16, merged)",
            runs::HEAL_RANK
        );
        let v = runs::validation_nll(ctx, &subject)?;
        healed_ranked.push((v.mean, method.to_string()));
        if let Some(start) = one_window(&p.value.report.removed_layers, l.m) {
            let items = nll.value.metric("answer_nll", &name)?.clone();
            window_candidates.push((v, (method.to_string(), start, name.clone(), items, subject)));
        }
        compressed.push((rows.len(), nll.value.metric("answer_nll", &name)?.clone()));
        rows.push(row(
            name,
            &format!(
                "training-free + healing, {} steps × {} × {} tokens",
                l.lora.steps, l.lora.batch_size, l.lora.seq_len
            ),
            shape,
            (
                l.lora.max_tokens(),
                p.value.report.seconds + healed.value.compute_seconds(),
            ),
            &nll.value,
            em.as_ref().map(|e| &e.value),
        )?);
    }
    for (r, items) in [Some(streamline_row), streamline_ffn_row, Some(looped_row)]
        .into_iter()
        .flatten()
    {
        compressed.push((rows.len(), items));
        rows.push(r);
    }
    healed_ranked.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut same_window = vec![];
    let mut same_window_pair = None;
    let mut same_window_start = None;
    let (mut same_window_items, mut same_window_baseline_items) = (None, None);
    let best_healed = best_on_validation(window_candidates);
    let window_choice = match &best_healed {
        Some((method, start, ..)) if *start != l.start => format!(
            "layers {start}–{}: the window of {method} + heal, the healed baseline with the lowest \
             validation answer NLL ({} validation problems)",
            start + l.m - 1,
            l.validation_eval
        ),
        _ => format!(
            "layers {}–{}: the study's window (no healed baseline removing one other window \
             scored better on validation)",
            l.start,
            l.start + l.m - 1
        ),
    };
    let mut headline: Option<(String, Done<Trained>, MetricReport)> = None;
    if let Some((method, start, baseline, baseline_items, baseline_subject)) =
        best_healed.filter(|b| b.1 != l.start)
    {
        full_test_rows.push((
            baseline.clone(),
            "the best healed baseline (validation), at this window".into(),
            baseline_subject,
        ));
        let t = runs::train(ctx, &Variant::elm(start, l.m), &l.main, None)?;
        same_window_start = Some(start);
        let name = format!(
            "ELM at {method}'s window (layers {start}–{}; Anderson, δ = 0.5)",
            start + l.m - 1
        );
        let (r, items) = trained_row(
            ctx,
            name.clone(),
            &format!("ELM, {budget}"),
            &t,
            ExactMatch::Scored,
        )?;
        let what = format!("{baseline} vs {name}");
        same_window_pair = Some(SameWindow {
            baseline,
            elm: name.clone(),
            layers: (start, start + l.m - 1),
            delta_baseline_minus_elm: paired_delta(&baseline_items, &items, &what)?,
        });
        same_window_items = Some(items.clone());
        same_window_baseline_items = Some(baseline_items);
        headline = Some((name, t.clone_done(), items.clone()));
        compressed.push((rows.len(), items));
        rows.push(r);
        same_window.push((format!("ELM M={} at layer {start} (main)", l.m), t));
    }
    let (headline_name, headline_elm, headline_items) = headline.unwrap_or_else(|| {
        (
            MAIN_ELM_ROW.to_string(),
            elm.clone_done(),
            elm_row.1.clone(),
        )
    });
    let hw = same_window_start.unwrap_or(l.start);
    // The controls at the headline window and budget, each paired with the ELM there.
    let mut control_rows = vec![];
    // What table 1b scores for each control, in `control_rows`' order.
    let mut control_subjects = vec![];
    // A control's row of the controls table: its gap to the headline ELM, paired.
    let control =
        |kind: ControlKind, control: String, model: &str, params: usize, items: &MetricReport| {
            Ok::<_, ReproError>(Control {
                kind,
                control,
                model: model.to_string(),
                params,
                minus_elm: paired_delta(
                    items,
                    &headline_items,
                    &format!("{model} vs {headline_name}"),
                )?,
            })
        };
    // (a) Equal parameters: the best healed baseline (validation) removing one layer fewer.
    // `healed_ranked` is sorted by validation NLL above (stable): its first is the best.
    if let (Some((_, method)), true) = (healed_ranked.first().cloned(), l.m >= 2) {
        let p = runs::prune(ctx, &method, l.m - 1)?;
        let Healed {
            run: healed,
            subject,
            nll,
            em,
        } = heal_and_eval(ctx, &p, ExactMatch::Skipped)?;
        let name = format!(
            "{method} at M = {} + LoRA healing (equal-parameter control; layers {:?})",
            l.m - 1,
            p.value.report.removed_layers
        );
        let items = nll.value.metric("answer_nll", &name)?.clone();
        control_rows.push(control(
            ControlKind::EqualParameters,
            format!(
                "equal parameters: {method} + heal removing M − 1 = {} layers",
                l.m - 1
            ),
            &name,
            p.value.report.params,
            &items,
        )?);
        control_subjects.push(subject);
        compressed.push((rows.len(), items));
        rows.push(row(
            name,
            &format!(
                "control, training-free + healing, {} steps × {} × {} tokens",
                l.lora.steps, l.lora.batch_size, l.lora.seq_len
            ),
            (
                p.value.report.params,
                p.value.report.non_embedding_params,
                p.value.report.kv_bytes_1k,
            ),
            (
                l.lora.max_tokens(),
                p.value.report.seconds + healed.value.compute_seconds(),
            ),
            &nll.value,
            em.as_ref().map(|e| &e.value),
        )?);
    }
    // (b) Fixed depth: the same module looped K times with injection (trained and tested at
    // K, no solve), K = the looped baseline's and K = the headline ELM's mean iterations on
    // validation (a control's parameter never comes from test problems).
    let mean_iterations =
        runs::validation_nll(ctx, &Subject::elm(&headline_elm, "anderson", 0.5))?.block_evals;
    let mut ks = vec![l.looped_k];
    let k_mean = (mean_iterations.round() as usize).max(1);
    if !ks.contains(&k_mean) {
        ks.push(k_mean);
    }
    for k in ks {
        let t = runs::train(ctx, &Variant::elm_fixed(hw, l.m, k), &l.main, None)?;
        let why = if k == k_mean {
            format!("the ELM's mean iterations on validation, {mean_iterations:.1}, rounded")
        } else {
            "the looped baseline's K".to_string()
        };
        let name = format!(
            "fixed-depth control: the module looped K = {k} times with injection, trained and tested at K (layers {hw}–{}; K = {why})",
            hw + l.m - 1
        );
        let (r, items) = trained_row(
            ctx,
            name.clone(),
            &format!("control, {budget}"),
            &t,
            ExactMatch::Skipped,
        )?;
        control_rows.push(control(
            ControlKind::FixedDepth,
            format!("fixed depth: K = {k} ({why})"),
            &name,
            t.value.compress.params.elm_total,
            &items,
        )?);
        control_subjects.push(Subject::elm(&t, "anderson", 0.5));
        compressed.push((rows.len(), items));
        rows.push(r);
        same_window.push((format!("fixed K={k} M={} at layer {hw} (control)", l.m), t));
    }
    // (c) The closest prior method: Relaxed Recursive Transformers at the same window, data,
    // losses and budget (one shared block, the window's mean, looped M times, loop k with an
    // SVD-initialised LoRA of layer hw + k's difference to it); scored as the dense model its
    // loops merge into.
    let t = runs::train(ctx, &Variant::relaxed(hw, l.m), &l.main, None)?;
    let name = format!(
        "Relaxed Recursive Transformer: one shared block (mean of layers {hw}–{}) looped M = {} times, per-loop LoRA r = {} from the SVD of each layer's difference (prior-method control)",
        hw + l.m - 1,
        l.m,
        runs::RELAXED_RANK
    );
    let (r, items) = trained_row(
        ctx,
        name.clone(),
        &format!("control, {budget}"),
        &t,
        ExactMatch::Skipped,
    )?;
    control_rows.push(control(
        ControlKind::PriorMethod,
        format!(
            "prior method: Relaxed Recursive Transformers (Bae et al., ICLR 2025), r = {}",
            runs::RELAXED_RANK
        ),
        &name,
        t.value.compress.params.elm_total,
        &items,
    )?);
    control_subjects.push(Subject::elm(&t, "anderson", 0.5));
    compressed.push((rows.len(), items));
    rows.push(r);
    same_window.push((
        format!("relaxed recursive M={} at layer {hw} (control)", l.m),
        t,
    ));
    let controls = Controls {
        elm: headline_name.clone(),
        layers: (hw, hw + l.m - 1),
        elm_params: headline_elm.value.compress.params.elm_total,
        window_choice,
        rows: control_rows,
    };
    for (c, subject) in controls.rows.iter().zip(control_subjects) {
        full_test_rows.push((c.model.clone(), c.control.clone(), subject));
    }
    let full_test = match l.full_test {
        Some(_) => Some(full_test(
            ctx,
            &headline_name,
            &headline_elm,
            &full_test_rows,
        )?),
        None => None,
    };
    // ELM + heal at the window where the methods meet (else the study's): the same budget,
    // the module and the adapters trained together. A window that ends at the last layer leaves
    // no layer after it to heal: then the study's window.
    // `small` leaves it out (`Limits::extra_rows`).
    let healed_elm = if l.extra_rows {
        let heal_start = same_window_start
            .filter(|&s| s + l.m < ctx.num_layers)
            .unwrap_or(l.start);
        let healed = runs::train(ctx, &Variant::elm_healed(heal_start, l.m), &l.main, None)?;
        let layers = (heal_start, heal_start + l.m - 1);
        let name = format!(
            "ELM + LoRA heal of the layers after the window (layers {}–{}; r = {}, α = 16; Anderson, δ = 0.5)",
            layers.0,
            layers.1,
            runs::HEAL_RANK
        );
        let (r, healed_items) = trained_row(
            ctx,
            name.clone(),
            &format!("ELM + heal, {budget}"),
            &healed,
            ExactMatch::Skipped,
        )?;
        let (plain_name, plain_items) = match (&same_window_pair, &same_window_items) {
            (Some(w), Some(items)) => (w.elm.clone(), items.clone()),
            _ => (MAIN_ELM_ROW.to_string(), elm_row.1.clone()),
        };
        let baseline = same_window_pair
            .as_ref()
            .map(|w| (w.baseline.clone(), same_window_baseline_items.clone()));
        let healed_elm = HealedElm {
            healed: name.clone(),
            plain: plain_name.clone(),
            layers,
            healed_minus_plain: paired_delta(
                &healed_items,
                &plain_items,
                &format!("{name} vs {plain_name}"),
            )?,
            baseline: baseline.as_ref().map(|b| b.0.clone()),
            baseline_minus_healed: match &baseline {
                Some((b, Some(items))) => Some(paired_delta(
                    items,
                    &healed_items,
                    &format!("{b} vs {name}"),
                )?),
                _ => None,
            },
        };
        compressed.push((rows.len(), healed_items));
        rows.push(r);
        same_window.push((
            format!("ELM + heal M={} at layer {heal_start} (main)", l.m),
            healed,
        ));
        Some(healed_elm)
    } else {
        None
    };
    // The ELM's own ablations, at its budget (what its solve and its injection contribute),
    // and the ELM and Streamline started from LaCo's merge instead of the window's first layer.
    let mut ablations = vec![];
    for (name, variant) in [
        (
            "ELM ablation: one iteration (with injection)".to_string(),
            Variant::elm_fixed(l.start, l.m, 1),
        ),
        (
            "ELM ablation: no input injection (solved)".to_string(),
            Variant::elm_no_injection(l.start, l.m),
        ),
        (
            "ELM initialised by LaCo's merge of the window (RDSC)".to_string(),
            Variant::elm(l.start, l.m).la_co_init(),
        ),
        (
            "LLM-Streamline initialised by LaCo's merge of the window (RDSC)".to_string(),
            Variant::streamline(l.start, l.m).la_co_init(),
        ),
    ]
    .into_iter()
    .filter(|(_, v)| l.la_co_init_rows || v.block_init.is_none())
    {
        let t = runs::train(ctx, &variant, &l.main, None)?;
        let kind = match variant.block_init {
            Some(_) => format!("LaCo-merged init, {budget}"),
            None => format!("ablation of the ELM, {budget}"),
        };
        let (r, items) = trained_row(ctx, name.clone(), &kind, &t, ExactMatch::Skipped)?;
        compressed.push((rows.len(), items));
        rows.push(r);
        ablations.push((format!("{name} (main)"), t));
    }
    // Every compressed row is paired with the headline ELM (the one at the headline window),
    // the study-window ELM included when that is another one.
    let (elm_row, elm_items) = elm_row;
    if headline_name != MAIN_ELM_ROW {
        compressed.push((rows.len(), elm_items));
    }
    rows.push(elm_row);
    for (i, items) in compressed {
        if rows[i].model == headline_name {
            continue;
        }
        let what = format!("{} vs {headline_name}", rows[i].model);
        rows[i].delta_nll_vs_elm = Some(paired_delta(&items, &headline_items, &what)?);
    }
    Ok(Main {
        rows,
        best_baseline: best_on_validation(baseline_scores).unwrap_or_else(|| "short-gpt".into()),
        controls,
        trainings: [
            Some((format!("ELM M={} (main)", l.m), elm.clone_done())),
            Some(("LLM-Streamline (main)".into(), streamline)),
            streamline_ffn.map(|t| ("LLM-Streamline FFN (main)".into(), t)),
            Some((format!("looped K={} (main)", l.looped_k), looped)),
        ]
        .into_iter()
        .flatten()
        .chain(same_window)
        .chain(ablations)
        .collect(),
        same_window: same_window_pair,
        same_window_start,
        healed_ranked: healed_ranked.into_iter().map(|(_, m)| m).collect(),
        healed_elm,
        full_test,
        elm,
    })
}

/// Table 1b: the headline ELM (`elm`, row `elm_name`) and `rows` (row name, role, subject)
/// scored on `Limits::full_test` test problems, each paired with the ELM there.
fn full_test(
    ctx: &mut Ctx<'_>,
    elm_name: &str,
    elm: &Done<Trained>,
    rows: &[(String, String, Subject)],
) -> Result<FullTest, ReproError> {
    let run = runs::eval_on(
        ctx,
        &Subject::elm(elm, "anderson", 0.5),
        "gsm8k-nll",
        Problems::FullTest,
    )?;
    let elm_items = run.value.metric("answer_nll", elm_name)?.clone();
    let mut out = vec![];
    for (model, role, subject) in rows {
        let run = runs::eval_on(ctx, subject, "gsm8k-nll", Problems::FullTest)?;
        let items = run.value.metric("answer_nll", model)?;
        out.push(FullTestRow {
            model: model.clone(),
            role: role.clone(),
            answer_nll: (&items.estimate).into(),
            minus_elm: paired_delta(items, &elm_items, &format!("{model} vs {elm_name}"))?,
        });
    }
    Ok(FullTest {
        problems: elm_items.estimate.n,
        elm: elm_name.to_string(),
        elm_answer_nll: (&elm_items.estimate).into(),
        rows: out,
    })
}

/// First layer of `removed` when it is `m` consecutive layers.
fn one_window(removed: &[usize], m: usize) -> Option<usize> {
    let first = *removed.first()?;
    (removed.len() == m && removed.iter().enumerate().all(|(i, &l)| l == first + i))
        .then_some(first)
}

/// Table 3 rows: every solver × δ on the main ELM.
/// The precision check of a bf16 run: the tuned dense model and the study's ELM (Anderson,
/// δ = 0.5) scored again with f32 products on the ablation tables' sample, each paired with its
/// own bf16 score on the same problems.
pub fn precision_check(
    ctx: &mut Ctx<'_>,
    dense: &Dense,
    elm: &Done<Trained>,
) -> Result<Vec<PrecisionRow>, ReproError> {
    let subjects = [
        (
            format!("{}, LoRA-tuned", ctx.model_name),
            Subject::tuned(&dense.tuned),
        ),
        (
            format!(
                "ELM, layers {}–{} (Anderson, δ = 0.5)",
                ctx.limits.start,
                ctx.limits.start + elm.value.m() - 1
            ),
            Subject::elm(elm, "anderson", 0.5),
        ),
    ];
    let mut rows = vec![];
    for (model, subject) in subjects {
        let bf16 = runs::eval_on(ctx, &subject, "gsm8k-nll", Problems::AblationTest)?;
        let f32 = runs::eval_on_in_f32(ctx, &subject, "gsm8k-nll", Problems::AblationTest)?;
        let (b, f) = (
            bf16.value.metric("answer_nll", &model)?,
            f32.value.metric("answer_nll", &model)?,
        );
        rows.push(PrecisionRow {
            bf16: (&b.estimate).into(),
            f32: (&f.estimate).into(),
            bf16_minus_f32: paired_delta(b, f, &model)?,
            bf16_iterations: bf16.value.solver.mean_iterations,
            f32_iterations: f32.value.solver.mean_iterations,
            model,
        });
    }
    Ok(rows)
}

/// The training-free method with the lowest validation answer NLL at the main M (the same
/// stages as table 1's baseline rows, so cached when table 1 ran).
pub fn best_baseline(ctx: &mut Ctx<'_>, _dense: &Dense) -> Result<String, ReproError> {
    let l = ctx.limits.clone();
    let mut scored = vec![];
    for method in &l.baselines {
        let p = runs::prune(ctx, method, l.m)?;
        scored.push((
            runs::validation_nll(ctx, &Subject::pruned(&p))?,
            method.to_string(),
        ));
    }
    best_on_validation(scored)
        .ok_or_else(|| ReproError::Setup("no training-free baseline configured".into()))
}

/// The candidate with the lowest validation answer NLL (the first of equals): the study's one
/// rule for "the best", which reads no test figure.
pub fn best_on_validation<T>(candidates: Vec<(runs::ValidationNll, T)>) -> Option<T> {
    candidates
        .into_iter()
        .reduce(|a, b| if b.0.mean < a.0.mean { b } else { a })
        .map(|(_, t)| t)
}

/// Table 6's check of the enumeration: the ELM fully trained at the study's window, at the best
/// healed baseline's window (both from table 1) and at GPPO's argmax (trained here, the same
/// budget), each with the rank the enumeration gave its start. Empty without table 1.
pub fn trained_windows(
    ctx: &mut Ctx<'_>,
    main: &[MainRow],
    same_window: Option<&SameWindow>,
    w: &WhereToPrune,
) -> Result<Vec<TrainedWindow>, ReproError> {
    let l = ctx.limits.clone();
    let rank = |start: usize| {
        w.enum_ranking
            .iter()
            .position(|&s| s == start)
            .map(|i| i + 1)
    };
    let row_nll = |name: &str| main.iter().find(|r| r.model == name).map(|r| r.answer_nll);
    let mut rows = vec![];
    let Some(main_elm) = row_nll(MAIN_ELM_ROW) else {
        return Ok(rows);
    };
    rows.push(TrainedWindow {
        start: l.start,
        why: "the study's window (table 1's ELM)".into(),
        answer_nll: main_elm,
        enum_rank: rank(l.start),
    });
    if let Some(sw) = same_window {
        if let Some(nll) = row_nll(&sw.elm) {
            rows.push(TrainedWindow {
                start: sw.layers.0,
                why: format!("{}'s window", sw.baseline),
                answer_nll: nll,
                enum_rank: rank(sw.layers.0),
            });
        }
    }
    if let Some(g) = &w.gppo {
        if rows.iter().all(|r| r.start != g.choice) {
            let trained = runs::train(ctx, &Variant::elm(g.choice, l.m), &l.main, None)?;
            let nll = runs::eval(ctx, &Subject::elm(&trained, "anderson", 0.5), "gsm8k-nll")?;
            let what = format!("ELM at GPPO's window {}", g.choice);
            rows.push(TrainedWindow {
                start: g.choice,
                why: "GPPO's argmax (the paper's pipeline)".into(),
                answer_nll: (&nll.value.metric("answer_nll", &what)?.estimate).into(),
                enum_rank: rank(g.choice),
            });
        }
    }
    Ok(rows)
}

/// Table 6b: the ELM trained at the main budget from every `every`-th start (and the last),
/// each scored on the validation sample and ranked; GPPO's choice, the selectors' and the
/// enumeration's best placed on that ranking.
pub fn fully_trained(
    ctx: &mut Ctx<'_>,
    w: &WhereToPrune,
    every: usize,
) -> Result<FullyTrained, ReproError> {
    let l = ctx.limits.clone();
    let last = ctx.num_layers - l.m;
    let mut starts: Vec<usize> = (0..=last).step_by(every.max(1)).collect();
    if starts.last() != Some(&last) {
        starts.push(last);
    }
    let mut scored = vec![];
    for &start in &starts {
        let trained = runs::train(ctx, &Variant::elm(start, l.m), &l.main, None)?;
        let run = runs::eval_on(
            ctx,
            &Subject::elm(&trained, "anderson", 0.5),
            "gsm8k-nll",
            Problems::Validation,
        )?;
        let what = format!("ELM at start {start} (validation)");
        let nll: Interval = (&run.value.metric("answer_nll", &what)?.estimate).into();
        scored.push((start, nll));
    }
    let mut order: Vec<usize> = (0..scored.len()).collect();
    order.sort_by(|&a, &b| {
        scored[a]
            .1
            .value
            .total_cmp(&scored[b].1.value)
            .then(scored[a].0.cmp(&scored[b].0))
    });
    let rank_of = |i: usize| order.iter().position(|&j| j == i).map_or(0, |p| p + 1);
    let best = scored[order[0]].1.value;
    let place = |method: &str, choice: usize| {
        let i = (0..scored.len())
            .min_by_key(|&i| scored[i].0.abs_diff(choice))
            .unwrap_or(0);
        TrainedPlacement {
            method: method.to_string(),
            choice,
            trained_start: scored[i].0,
            rank: rank_of(i),
            nll_gap: scored[i].1.value - best,
        }
    };
    let mut placements = vec![];
    if let Some(&e) = w.enum_ranking.first() {
        placements.push(place("enumeration (short candidates)", e));
    }
    if let Some(g) = &w.gppo {
        placements.push(place("gppo", g.choice));
    }
    for p in &w.metrics {
        placements.push(place(&p.method, p.choice));
    }
    Ok(FullyTrained {
        starts: scored
            .iter()
            .enumerate()
            .map(|(i, &(start, validation_nll))| TrainedStart {
                start,
                validation_nll,
                rank: rank_of(i),
            })
            .collect(),
        placements,
    })
}

/// Table 10: the ELM trained at the main budget from each of the scale's collapse starts under
/// both distillation recipes (the paper's absolute MSE and the MSE relative to the teacher's
/// mean square), each with the teacher's RMS at the window, its first and last losses, its
/// held-out distillation error, ρ at its fixed point and its answer NLL (the ablation tables'
/// test sample).
pub fn collapse(ctx: &mut Ctx<'_>, dense: &Dense) -> Result<Vec<CollapseRow>, ReproError> {
    use elm::equilibrium::DistillScale;
    let l = ctx.limits.clone();
    let study_recipe = ctx.distill_scale;
    let mut rows = vec![];
    for &start in &l.collapse_starts {
        for recipe in [DistillScale::Absolute, DistillScale::TeacherMeanSquare] {
            ctx.distill_scale = recipe;
            let trained = runs::train(ctx, &Variant::elm(start, l.m), &l.main, None);
            ctx.distill_scale = study_recipe;
            let t = trained?;
            let what = format!("collapse start {start} {recipe:?}");
            let o = &t.value.train.outcome;
            let rms = o.window_rms.ok_or_else(|| ReproError::Schema {
                command: what.clone(),
                source: serde::de::Error::custom("`window_rms` is null (no held-out problems)"),
            })?;
            let s = runs::spectral(ctx, &t)?;
            let run = ablation_nll(ctx, &t)?;
            let (nll, delta) = nll_cells(&run.value, dense, &what)?;
            rows.push(CollapseRow {
                start,
                m: l.m,
                recipe: serde_json::to_value(recipe)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_else(|| format!("{recipe:?}")),
                rms_entering: rms.entering,
                rms_leaving: rms.leaving,
                first_distill: o.first.as_ref().map_or(f64::NAN, |s| s.distill),
                first_ce: o.first_with_ce.as_ref().and_then(|s| s.ce),
                final_distill: o.last.as_ref().map_or(f64::NAN, |s| s.distill),
                final_ce: o.last.as_ref().and_then(|s| s.ce),
                held_out_distill: t.value.distill_after()?,
                mean_radius: s.value.mean_radius,
                max_radius: s.value.max_radius,
                answer_nll: nll,
                delta_nll: delta,
            });
        }
    }
    Ok(rows)
}
