//! `elm search` (stages 2/3: GPPO, enumeration, metric selectors, the "where to prune"
//! report) — argument parsing, progress bars, plots.

use std::path::{Path, PathBuf};

use plotters::element::ErrorBar;
use plotters::prelude::*;

use super::output::{open_run, OpenedRun};
use elm::compress::{BoundaryStates, Calibration};
use elm::data::{resolve_data_dir, tokenize_all, validation_problems, Example};
use elm::error::{ElmError, Result};
use elm::formats::tokenizer::Tokenizer;
use elm::io::read_json;
use elm::io::{write_json_atomic, RunStart};
use elm::model::load_pretrained;
use elm::search::gppo::{GppoEvent, GPPO_STATE_FILE};
use elm::search::{
    enumerate, metric_choice, where_to_prune, EnumConfig, Enumeration, Gppo, GppoConfig,
    GppoOutcome, SearchMethod, Selector,
};

use super::lora::train_data;
use super::output::{bar, finish_plot, legend_line, print_json, to_json, write_plot, DrawResult};

#[derive(clap::Args, Debug)]
pub struct SearchArgs {
    /// Dense model (the tuned dense from `elm lora`, OUT/model, or the untuned one).
    #[arg(long)]
    pub model: PathBuf,
    /// A stage of the pipeline or one training-free selector.
    #[arg(long, value_parser = super::registry::named::<elm::search::SearchMethod>())]
    pub method: elm::search::SearchMethod,
    /// Window length M.
    #[arg(long = "num-replaced", alias = "m", default_value_t = 8)]
    pub num_replaced: usize,
    /// GppoConfig / EnumConfig JSON (unknown keys rejected); flags below override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// GPPO steps, or training steps per enumerated start.
    #[arg(long)]
    pub steps: Option<usize>,
    #[arg(long)]
    pub seq_len: Option<usize>,
    /// Enumerate every k-th start.
    #[arg(long)]
    pub every: Option<usize>,
    /// GPPO: policy update every p steps.
    #[arg(long)]
    pub update_every: Option<usize>,
    /// GPPO: PPO epochs q per update.
    #[arg(long)]
    pub ppo_epochs: Option<usize>,
    #[arg(long)]
    pub clip_eps: Option<f64>,
    #[arg(long)]
    pub entropy_coef: Option<f64>,
    #[arg(long)]
    pub policy_lr: Option<f64>,
    /// Reward-model / candidate learning rate.
    #[arg(long)]
    pub lr: Option<f32>,
    #[arg(long)]
    pub seed: Option<u64>,
    /// Output directory.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// gppo, enumerate: continue the run saved in --out, or replace a non-empty one.
    #[command(flatten)]
    pub run: super::output::RunFlags,
    /// Held-out GSM8K validation problems (the end of train.jsonl, never trained on) for the
    /// enumeration's answer NLL.
    #[arg(long, default_value_t = 16)]
    pub eval_examples: usize,
    #[command(flatten)]
    pub source: super::output::DataFlags,
    /// Metric selectors: calibration tokens (GSM8K train in the chat template) and chunk length.
    #[arg(long, default_value_t = 2048)]
    pub calibration_tokens: usize,
    #[arg(long, default_value_t = 128)]
    pub calibration_seq_len: usize,
    /// report: the GPPO run directory and the enumeration directory.
    #[arg(long)]
    pub gppo: Option<PathBuf>,
    #[arg(long)]
    pub enumeration: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
}

fn need_out(a: &SearchArgs) -> Result<&Path> {
    a.out.as_deref().ok_or_else(|| {
        ElmError::config(
            "out",
            format!("--method {} needs --out DIR", a.method.name()),
        )
    })
}

/// `elm search`.
pub fn run_search(a: SearchArgs) -> Result<()> {
    match a.method {
        SearchMethod::Gppo => run_gppo(&a),
        SearchMethod::Enumerate => run_enumerate(&a),
        SearchMethod::Report => run_report(&a),
        SearchMethod::Metric(selector) => run_metric(&a, selector),
    }
}

fn apply_candidate_flags(a: &SearchArgs, c: &mut elm::search::candidate::CandidateConfig) {
    if let Some(s) = a.seq_len {
        c.seq_len = s;
    }
    if let Some(lr) = a.lr {
        c.optim.lr = lr;
    }
    if let Some(s) = a.seed {
        c.seed = s;
    }
}

fn run_gppo(a: &SearchArgs) -> Result<()> {
    let out = need_out(a)?;
    let OpenedRun {
        run,
        start,
        dense,
        tok,
    } = open_run::<GppoConfig>(out, &a.run, ("gppo", GPPO_STATE_FILE, "search"), &a.model)?;
    // A fresh search's request, written once everything is checked, before its first save.
    let mut request = None;
    let mut g = match start {
        RunStart::Resume => Gppo::resume(&dense, out)?,
        // Stopped before its starting point was saved: nothing was trained, so the search
        // starts again as it was requested.
        RunStart::Restart { request: cfg, .. } => {
            Gppo::new(&dense, cfg, a.model.display().to_string())?
        }
        RunStart::Fresh => {
            let mut cfg = match &a.config {
                Some(p) => GppoConfig::from_file(p)?,
                None => GppoConfig::new(a.num_replaced, a.steps.unwrap_or(100)),
            };
            if a.config.is_some() {
                if let Some(s) = a.steps {
                    cfg.steps = s;
                }
            }
            apply_candidate_flags(a, &mut cfg.candidate);
            if let Some(v) = a.update_every {
                cfg.update_every = v;
            }
            if let Some(v) = a.ppo_epochs {
                cfg.ppo_epochs = v;
            }
            if let Some(v) = a.clip_eps {
                cfg.clip_eps = v;
            }
            if let Some(v) = a.entropy_coef {
                cfg.entropy_coef = v;
            }
            if let Some(v) = a.policy_lr {
                cfg.policy_lr = v;
            }
            let g = Gppo::new(&dense, cfg.clone(), a.model.display().to_string())?;
            request = Some(cfg);
            g
        }
    };
    let data = train_data(
        &tok,
        a.source.data.as_deref(),
        a.source.data_dir.as_deref(),
        g.cfg.candidate.seq_len,
    )?;
    let pad = tok.eos_id().unwrap_or(0);
    let b = bar(g.cfg.steps, g.step);
    if let Some(req) = &request {
        run.write_request("gppo", &dense.config, req)?;
    }
    let outcome = g.run(&data, pad, out, |ev| match ev {
        GppoEvent::Step(l) => {
            b.set_message(format!(
                "start {} reward {:.3} distill {:.4}",
                l.action, l.reward, l.candidate.distill
            ));
            b.inc(1);
        }
        GppoEvent::Update(u) => {
            let top = elm::compress::metrics::argmax(&u.probs).unwrap_or(0);
            b.println(format!(
                "update at step {}: argmax θ = {top} (p = {:.3}), mean reward {:.3}",
                u.step, u.probs[top], u.mean_reward
            ));
        }
        GppoEvent::Checkpoint { .. } => {}
    })?;
    b.finish_and_clear();
    plot_theta(&out.join("gppo_theta.svg"), &outcome)?;
    if a.json {
        let mut v = to_json(&outcome)?;
        v["out"] = out.display().to_string().into();
        print_json(&v)?;
    } else {
        say!(
            "GPPO {} steps ({:.0}s this run): chosen start = argmax θ = {}; softmax θ = [{}]; trace {}",
            outcome.steps,
            outcome.seconds,
            outcome.chosen_start,
            outcome
                .probs
                .iter()
                .map(|p| format!("{p:.3}"))
                .collect::<Vec<_>>()
                .join(", "),
            out.join("gppo_trace.json").display()
        );
    }
    Ok(())
}

fn run_enumerate(a: &SearchArgs) -> Result<()> {
    let out = need_out(a)?;
    let existing = out.join(elm::search::enumerate::ENUM_FILE);
    let OpenedRun {
        run,
        start,
        dense,
        tok,
    } = open_run::<EnumConfig>(
        out,
        &a.run,
        (
            "enumerate",
            elm::search::enumerate::ENUM_FILE,
            "enumeration",
        ),
        &a.model,
    )?;
    // The request is (re)written unless an entry is saved: an enumeration stopped before its
    // first entry stays resumable.
    let write_request = !matches!(start, RunStart::Resume);
    let mut cfg = match start {
        RunStart::Resume => read_json::<Enumeration>(&existing)?.config,
        // Stopped before its first entry was saved: nothing was trained, so the enumeration
        // starts again as it was requested.
        RunStart::Restart { request, .. } => request,
        RunStart::Fresh => match &a.config {
            Some(p) => elm::train::read_config_file(p, &["candidate"])?,
            None => EnumConfig {
                candidate: elm::search::candidate::CandidateConfig::new(a.num_replaced),
                steps: 10,
                every: 1,
            },
        },
    };
    if !a.run.resume {
        if let Some(s) = a.steps {
            cfg.steps = s;
        }
        if let Some(k) = a.every {
            cfg.every = k;
        }
        apply_candidate_flags(a, &mut cfg.candidate);
    }
    cfg.validate(&dense.config)?;
    let seq = cfg.candidate.seq_len;
    let data = train_data(
        &tok,
        a.source.data.as_deref(),
        a.source.data_dir.as_deref(),
        seq,
    )?;
    let test = validation_problems(a.source.data_dir.as_deref(), a.eval_examples)?;
    let held = tokenize_all(
        &tok,
        &test.into_iter().map(Example::Qa).collect::<Vec<_>>(),
        seq,
    )?;
    let pad = tok.eos_id().unwrap_or(0);
    let starts = cfg.starts(&dense.config);
    let b = bar(starts.len() * cfg.steps, 0);
    if write_request {
        run.write_request("enumerate", &dense.config, &cfg)?;
    }
    let e = enumerate(
        &dense,
        &cfg,
        &data,
        &held,
        pad,
        Some(out),
        |start, step| {
            b.set_message(format!("start {start} step {step}"));
            b.inc(1);
        },
        |entry| {
            b.println(format!(
                "start {:2}: held-out answer NLL {:.4} (init {:.4}), {:.0}s",
                entry.start, entry.nll, entry.nll_init, entry.seconds
            ));
        },
    )?;
    b.finish_and_clear();
    if a.json {
        print_json(&e)?;
    } else {
        say!(
            "enumeration ({} starts, {} steps each; dense NLL {:.4}): ranking best first {:?}",
            e.entries.len(),
            cfg.steps,
            e.dense_nll,
            e.ranking()
        );
    }
    Ok(())
}

fn calibration(a: &SearchArgs, tok: &Tokenizer) -> Result<Calibration> {
    match &a.source.data {
        Some(p) => Calibration::from_file(tok, p, a.calibration_seq_len, a.calibration_tokens),
        None => Calibration::from_gsm8k_train(
            tok,
            &resolve_data_dir(a.source.data_dir.as_deref())?,
            a.calibration_seq_len,
            a.calibration_tokens,
        ),
    }
}

fn run_metric(a: &SearchArgs, method: Selector) -> Result<()> {
    let (dense, tok) = load_pretrained(&a.model)?;
    let calib = calibration(a, &tok)?;
    let states = BoundaryStates::collect(&dense, &calib, 4)?;
    let mc = metric_choice(&dense, &calib, &states, method, a.num_replaced, 4)?;
    if a.json {
        print_json(&mc)?;
    } else {
        say!(
            "{}: chosen start {} (scores by start, {} is better: {:?})",
            method.name(),
            mc.choice,
            if mc.lower_is_better {
                "lower"
            } else {
                "higher"
            },
            mc.scores
        );
    }
    Ok(())
}

fn run_report(a: &SearchArgs) -> Result<()> {
    let out = need_out(a)?;
    // The report adds its files beside whatever the directory holds.
    let _run = super::output::lock_out_dir(out, elm::io::OpenMode::Reuse)?;
    let edir = a.enumeration.as_ref().ok_or_else(|| {
        ElmError::config("enumeration", "--method report needs --enumeration DIR")
    })?;
    let e: Enumeration = read_json(&edir.join(elm::search::enumerate::ENUM_FILE))?;
    let g: Option<GppoOutcome> = a
        .gppo
        .as_ref()
        .map(|d| read_json(&d.join("gppo_trace.json")))
        .transpose()?;
    let (dense, tok) = load_pretrained(&a.model)?;
    let calib = calibration(a, &tok)?;
    let states = BoundaryStates::collect(&dense, &calib, 4)?;
    let m = e.config.candidate.num_replaced;
    let metrics = Selector::ALL
        .into_iter()
        .map(|s| metric_choice(&dense, &calib, &states, s, m, 4))
        .collect::<Result<Vec<_>>>()?;
    let r = where_to_prune(&e, g.as_ref(), &metrics)?;
    std::fs::create_dir_all(out).map_err(|err| ElmError::io(out, err))?;
    write_json_atomic(&out.join("where_to_prune.json"), &r)?;
    plot_where(&out.join("where_to_prune.svg"), &r, g.as_ref())?;
    if a.json {
        print_json(&r)?;
    } else {
        say!("enumeration ranking (best first): {:?}", r.enum_ranking);
        if let Some(p) = &r.gppo {
            say!(
                "gppo: argmax θ = {} (on grid {}), enumeration rank {} of {}, Spearman(θ, −NLL) = {}",
                p.choice,
                p.choice_on_grid,
                p.enum_rank,
                r.enum_ranking.len(),
                r.gppo_spearman.map_or("n/a".into(), |v| format!("{v:.3}"))
            );
        }
        for p in &r.metrics {
            say!(
                "{}: start {} (on grid {}), enumeration rank {}, NLL gap {:.4}",
                p.method,
                p.choice,
                p.choice_on_grid,
                p.enum_rank,
                p.nll_gap
            );
        }
    }
    Ok(())
}

fn write_svg(
    path: &Path,
    draw: impl FnOnce(DrawingArea<SVGBackend<'_>, plotters::coord::Shift>) -> DrawResult,
) -> Result<()> {
    write_plot(path, (900, 560), draw, None)
}

/// softmax θ over the updates: one line per start (the chosen start drawn thick).
fn plot_theta(path: &Path, g: &GppoOutcome) -> Result<()> {
    if g.trace.is_empty() {
        return Ok(());
    }
    let k = g.probs.len();
    let max_step = g.trace.last().map_or(1, |u| u.step).max(1);
    let pmax = g
        .trace
        .iter()
        .flat_map(|u| u.probs.iter().copied())
        .fold(1.0 / k as f64, f64::max);
    write_svg(path, |root| {
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!("GPPO: softmax θ over steps (argmax = {})", g.chosen_start),
                ("sans-serif", 20),
            )
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..max_step as f64, 0f64..(pmax * 1.05))?;
        chart
            .configure_mesh()
            .x_desc("reward-model steps")
            .y_desc("π(start)")
            .draw()?;
        for s in 0..k {
            let color = Palette99::pick(s).to_rgba();
            let width = if s == g.chosen_start { 3 } else { 1 };
            let pts = std::iter::once((0.0, 1.0 / k as f64))
                .chain(g.trace.iter().map(|u| (u.step as f64, u.probs[s])));
            let series = chart.draw_series(LineSeries::new(pts, color.stroke_width(width)))?;
            if s == g.chosen_start {
                series
                    .label(format!("start {s}"))
                    .legend(legend_line(color.stroke_width(3)));
            }
        }
        finish_plot(&mut chart, Some(SeriesLabelPosition::UpperLeft))
    })
}

/// Where to prune: enumeration NLL by start (line, points and each point's 95% interval over
/// the held-out problems), GPPO's final softmax θ (bars on an axis of their own, scaled to their
/// range), and each metric's choice (vertical markers); the legend sits right of the plot.
fn plot_where(path: &Path, r: &elm::search::WhereToPrune, g: Option<&GppoOutcome>) -> Result<()> {
    const PLOT_WIDTH: u32 = 900;
    const LEGEND_WIDTH: u32 = 400;
    let k = r.num_layers + 1 - r.num_replaced;
    let (lo, hi) = r.enum_nll.iter().enumerate().fold(
        (r.dense_nll, f64::NEG_INFINITY),
        |(lo, hi), (i, &(_, v))| {
            let (a, b) = r.enum_interval(i).unwrap_or((v, v));
            (lo.min(a).min(v), hi.max(b).max(v))
        },
    );
    let pad = ((hi - lo) * 0.05).max(1e-3);
    let (lo, hi) = (lo - pad, hi + pad);
    let pmax = g
        .map(|g| g.probs.iter().copied().fold(0.0, f64::max))
        .unwrap_or(1.0)
        .max(1e-6);
    write_plot(
        path,
        (PLOT_WIDTH + LEGEND_WIDTH, 560),
        |root| {
            root.fill(&WHITE)?;
            let root = root.titled(
                &format!(
                    "Where to prune (M = {}): held-out answer NLL by window start",
                    r.num_replaced
                ),
                ("sans-serif", 20),
            )?;
            let (plot_area, legend_area) = root.split_horizontally(PLOT_WIDTH);
            // The legend's entries, drawn right of the plot (outside the data) at the end.
            let mut legend: Vec<(String, ShapeStyle)> = vec![];
            let mut chart = ChartBuilder::on(&plot_area)
                .margin(15)
                .x_label_area_size(40)
                .y_label_area_size(60)
                .right_y_label_area_size(if g.is_some() { 60 } else { 0 })
                .build_cartesian_2d(-0.5f64..(k as f64 - 0.5), lo..hi)?
                // GPPO's probabilities on an axis of their own, fitted to their range.
                .set_secondary_coord(-0.5f64..(k as f64 - 0.5), 0f64..(pmax * 1.1));
            chart
                .configure_mesh()
                .x_labels(k.min(32))
                .x_label_formatter(&|x| {
                    if (x - x.round()).abs() < 1e-6 {
                        format!("{:.0}", x)
                    } else {
                        String::new()
                    }
                })
                .x_desc("start layer l (window [l, l+M)), layer index")
                .y_desc("held-out answer NLL (nats/token)")
                .draw()?;
            if g.is_some() {
                chart
                    .configure_secondary_axes()
                    .y_desc("GPPO probability of the start (softmax θ)")
                    .draw()?;
            }
            if let Some(g) = g {
                let col = RGBColor(200, 60, 0);
                chart.draw_secondary_series(g.probs.iter().enumerate().map(|(s, &p)| {
                    Rectangle::new(
                        [(s as f64 - 0.3, 0.0), (s as f64 + 0.3, p)],
                        col.mix(0.35).filled(),
                    )
                }))?;
                legend.push((
                    format!(
                        "GPPO softmax θ (right axis, bars; argmax {})",
                        g.chosen_start
                    ),
                    col.mix(0.35).stroke_width(8),
                ));
            }
            chart.draw_series(LineSeries::new(
                r.enum_nll.iter().map(|&(s, v)| (s as f64, v)),
                BLUE.stroke_width(2),
            ))?;
            legend.push((
                "enumeration (trained candidate; bars: 95% over problems)".into(),
                BLUE.stroke_width(2),
            ));
            chart.draw_series(r.enum_nll.iter().enumerate().filter_map(|(i, &(s, v))| {
                r.enum_interval(i)
                    .map(|(a, b)| ErrorBar::new_vertical(s as f64, a, v, b, BLUE.filled(), 8))
            }))?;
            chart.draw_series(
                r.enum_nll
                    .iter()
                    .map(|&(s, v)| Circle::new((s as f64, v), 4, BLUE.filled())),
            )?;
            chart.draw_series(LineSeries::new(
                [(-0.5, r.dense_nll), (k as f64 - 0.5, r.dense_nll)],
                BLACK.stroke_width(1),
            ))?;
            legend.push(("dense".into(), BLACK.stroke_width(1)));
            let dashes = [(4, 0), (8, 4), (2, 3), (12, 4)];
            for (i, p) in r.metrics.iter().enumerate() {
                let color = Palette99::pick(i + 3).to_rgba();
                let x = p.choice as f64 + 0.08 * (i as f64 - 1.5);
                let (size, gap) = dashes[i % dashes.len()];
                let style = color.stroke_width(2);
                if gap == 0 {
                    chart.draw_series(LineSeries::new([(x, lo), (x, hi)], style))?;
                } else {
                    chart.draw_series(DashedLineSeries::new(
                        [(x, lo), (x, hi)],
                        size,
                        gap,
                        style,
                    ))?;
                }
                legend.push((
                    format!(
                        "{} choice: {} (rank {}; vertical line)",
                        p.method, p.choice, p.enum_rank
                    ),
                    style,
                ));
            }
            for (i, (label, style)) in legend.iter().enumerate() {
                let y = 40 + 22 * i as i32;
                legend_area.draw(&PathElement::new(vec![(10, y), (34, y)], *style))?;
                legend_area.draw(&Text::new(label.clone(), (42, y - 7), ("sans-serif", 13)))?;
            }
            chart.plotting_area().present()?;
            Ok(())
        },
        None,
    )
}
