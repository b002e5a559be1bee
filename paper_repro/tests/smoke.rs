//! The one-command reproduction at `smoke` scale, end to end on the real SmolLM2 checkpoint:
//! every table exists and every cell is filled (tables.json is read back into paper_repro's
//! typed rows, so a missing key fails here), and a second invocation reads every stage from
//! the cache.

use std::path::PathBuf;
use std::process::Command;

use paper_repro::rows::ControlKind;
use paper_repro::scale::Scale;
use paper_repro::tables::Tables;

#[path = "../../tests/common/skip.rs"]
mod skip;

/// The real checkpoint: the library's one lookup (`$ELM_MODELS_DIR`, default `models/`).
fn model_path() -> PathBuf {
    elm::model::default_model_path()
}

fn run(out: &std::path::Path, model: &std::path::Path, extra: &[&str]) -> Tables {
    let output = Command::new(env!("CARGO_BIN_EXE_paper_repro"))
        .args(["--scale", "smoke", "--out"])
        .arg(out)
        .arg("--model")
        .arg(model)
        .args(extra)
        .output()
        .expect("run paper_repro");
    let said = String::from_utf8_lossy(&output.stderr);
    // Its progress lines are long; the failure's cause is at the end (CI keeps only the panic).
    let tail: Vec<&str> = said.lines().rev().take(15).collect();
    // Free space where it wrote (a full disk is one cause a log tail alone may not show).
    let df = Command::new("df")
        .arg("-h")
        .arg(out)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    assert!(
        output.status.success(),
        "paper_repro --scale smoke failed ({}); {df}the end of its stderr:\n{}\nstdout:\n{}",
        output.status,
        tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
        String::from_utf8_lossy(&output.stdout)
    );
    let text = std::fs::read_to_string(out.join("tables.json")).unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("tables.json is incomplete: {e}"))
}

fn check_interval(what: &str, i: &paper_repro::rows::Interval) {
    assert!(
        i.lo <= i.value && i.value <= i.hi && i.value.is_finite(),
        "{what}: {i:?}"
    );
}

#[test]
fn smoke_scale_fills_every_table_and_resumes_from_the_cache() {
    let model = model_path();
    if !skip::require(
        "the real model",
        model.exists(),
        format!("{} absent (run scripts/setup.sh)", model.display()),
    ) {
        return;
    }
    // Several GB of stage outputs: beside the build (which had room), not in a possibly small /tmp.
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("paper_repro_smoke_{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let t = run(&out, &model, &[]);
    let l = Scale::Smoke.limits();

    // Every table, with every row the scale asks for.
    // Dense (tuned, untuned), the baselines, their healed versions, Streamline (layer and FFN),
    // looped, the ELM at the best healed baseline's window (window-delete's 3–10 at smoke, not
    // the ELM's own; chosen on validation), ELM + heal there, the controls there (the healed
    // baseline at M − 1, the module looped at K = 2 and at the ELM's mean iterations when that
    // differs), the ELM's two ablations, ELM and Streamline from LaCo's merge, and the ELM.
    assert!(t.main.iter().any(|r| r
        .model
        .starts_with("ELM at window-delete's window (layers 3–10")));
    let c = t.controls.as_ref().expect("table 1's controls");
    assert_eq!(c.layers, (3, 10), "the controls sit at the headline window");
    // Equal parameters, one or two fixed depths, then the prior method (Relaxed Recursive
    // Transformers) with about the ELM's parameters (its adapters against the injection).
    let kinds: Vec<ControlKind> = c.rows.iter().map(|r| r.kind).collect();
    assert!(
        (3..=4).contains(&kinds.len())
            && kinds[0] == ControlKind::EqualParameters
            && kinds[1..kinds.len() - 1]
                .iter()
                .all(|k| *k == ControlKind::FixedDepth)
            && kinds[kinds.len() - 1] == ControlKind::PriorMethod,
        "{c:?}"
    );
    let prior = &c.rows[kinds.len() - 1];
    let ratio = prior.params as f64 / c.elm_params as f64;
    assert!(
        (0.99..1.01).contains(&ratio),
        "{prior:?} vs {}",
        c.elm_params
    );
    assert_eq!(
        t.main.len(),
        2 + l.baselines.len() + l.healed.len() + 3 + 1 + 1 + c.rows.len() + 4 + 1,
        "{:?}",
        t.main
    );
    // Table 1b: the headline ELM, the tuned dense model, the best healed baseline at that
    // window and every control, on the larger sample, each paired with the ELM.
    let f = t.full_test.as_ref().expect("table 1b at smoke");
    assert_eq!(Some(f.problems), l.full_test);
    assert_eq!(f.elm, c.elm);
    assert_eq!(f.rows.len(), 2 + c.rows.len(), "{f:?}");
    assert!(f.rows[0].role.starts_with("reference"));
    for (r, control) in f.rows[2..].iter().zip(&c.rows) {
        assert_eq!(r.model, control.model);
    }
    check_interval(&f.elm, &f.elm_answer_nll);
    for r in &f.rows {
        assert!(t.main.iter().any(|m| m.model == r.model), "{}", r.model);
        check_interval(&r.model, &r.answer_nll);
        check_interval(&r.model, &r.minus_elm);
    }
    // Every compressed row is paired with the headline ELM, which is not paired with itself.
    for r in &t.main {
        let paired = r.delta_nll_vs_elm.is_some();
        let expected = !(r.kind.starts_with("dense") || r.model == c.elm);
        assert_eq!(paired, expected, "{}", r.model);
    }
    // Table 6's check: fully trained ELMs at the study's window, the best healed baseline's and
    // GPPO's argmax (when it is another window), each placed in the enumeration.
    assert!(t.trained_windows.len() >= 2, "{:?}", t.trained_windows);
    assert_eq!(t.trained_windows[0].start, l.start);
    assert_eq!(t.kv.len(), 2 * l.kv_ms.len());
    // Table 3 at the main ELM's M and at M = 14 (the sweep's ELM).
    let solver_ms = if l.sweep.contains(&14) && l.m != 14 {
        2
    } else {
        1
    };
    assert_eq!(t.solver.len(), solver_ms * 3 * l.tolerances.len());
    assert!(t
        .solver
        .iter()
        .any(|r| r.m == 14 && r.steps == l.study.steps));
    // Table 6b: starts 0, 11 and the last (22) at smoke, ranked 1..=3; every selector placed.
    let f = t.fully_trained.as_ref().expect("table 6b at smoke");
    let mut starts: Vec<usize> = f.starts.iter().map(|r| r.start).collect();
    starts.sort_unstable();
    assert_eq!(starts, vec![0, 11, 22]);
    let mut ranks: Vec<usize> = f.starts.iter().map(|r| r.rank).collect();
    ranks.sort_unstable();
    assert_eq!(ranks, vec![1, 2, 3]);
    assert!(f.placements.iter().any(|p| p.method == "gppo"));
    for p in &f.placements {
        assert!(
            starts.contains(&p.trained_start) && (1..=3).contains(&p.rank),
            "{p:?}"
        );
    }
    // An f32 run has no precision check; the plots of the tables it has are written.
    assert!(t.precision_check.is_empty());
    assert!(out.join("plots/where_to_prune_trained.svg").exists());
    assert_eq!(t.grad.len(), 4);
    assert_eq!(t.sweep.len(), 2 * l.sweep.len());
    assert_eq!(t.canonical.len(), 6 * 3);
    assert_eq!(
        t.spectral.len(),
        l.sweep.len(),
        "the main ELM is the sweep's M = 8 model at smoke scale"
    );
    assert!(!t.speed.is_empty());
    // Table 11's corner at smoke scale: the ELM and one fixed loop, each tested at K' = 1 and 2
    // and solved; the ELM's own cell is its reference (0 against itself), every other cell paired.
    let g = t.grid.as_ref().expect("table 11 at smoke scale");
    let sizes = l.grid.as_ref().expect("smoke has a grid");
    let cells = sizes.test_ks.len() + sizes.test_tols.len();
    assert_eq!(g.rows.len(), (sizes.train_ks.len() + 1) * cells, "{g:?}");
    assert_eq!(g.layers, (3, 10), "the grid sits at the headline window");
    for r in &g.rows {
        check_interval("grid cell", &r.answer_nll);
        assert!(r.block_evals_per_token >= 1.0, "{r:?}");
        assert_eq!(r.minus_as_trained.is_none(), r.tested == r.trained, "{r:?}");
    }
    assert!(out.join("plots/train_k_test_k.svg").exists());
    for r in &t.main {
        check_interval(&r.model, &r.answer_nll);
        // Exact match is scored for the rows the headline reads by EM, not for the ranked-only
        // ones nor for the controls the verdict reads by their paired NLL.
        let scored = !(r.kind == "training-free"
            || r.model.starts_with("LLM-Streamline")
            || r.model.starts_with("looped block")
            || r.model.starts_with("ELM ablation")
            || r.model.starts_with("fixed-depth control")
            || r.model.starts_with("Relaxed Recursive Transformer")
            || r.kind.starts_with("control")
            || r.kind.starts_with("ELM + heal")
            || r.kind.starts_with("LaCo-merged init"));
        assert_eq!(r.flexible_em.is_some(), scored, "{r:?}");
        for em in [&r.flexible_em, &r.strict_em].into_iter().flatten() {
            check_interval(&r.model, em);
        }
        assert_eq!(r.delta_nll.is_none(), r.kind == "dense", "{r:?}");
        if let Some(d) = &r.delta_nll {
            check_interval(&r.model, d);
        }
        // Each row's own training budget and compute: the reference's LoRA run, nothing for
        // the untuned model and the training-free rows (whose compute is their selection),
        // the ELM's budget for every trained row and the LoRA budget (the ELM's but at smoke)
        // for the healed ones.
        let expected_tokens = match r.kind.as_str() {
            "dense" => l.lora.max_tokens(),
            "dense, untuned" | "training-free" => 0,
            k if k.starts_with("training-free + healing")
                || k.starts_with("control, training-free + healing") =>
            {
                l.lora.max_tokens()
            }
            _ => l.main.max_tokens(),
        };
        assert_eq!(r.train_tokens, expected_tokens, "{r:?}");
        assert_eq!(r.train_seconds > 0.0, r.kind != "dense, untuned", "{r:?}");
    }
    let healed: Vec<_> = t
        .main
        .iter()
        .filter(|r| r.kind.starts_with("training-free + healing"))
        .collect();
    assert_eq!(healed.len(), l.healed.len(), "{:?}", t.main);
    let ablations = t
        .main
        .iter()
        .filter(|r| r.kind.starts_with("ablation of the ELM"))
        .count();
    assert_eq!(ablations, 2, "{:?}", t.main);
    let la_co_init = t
        .main
        .iter()
        .filter(|r| r.kind.starts_with("LaCo-merged init"))
        .count();
    assert_eq!(la_co_init, 2, "{:?}", t.main);
    // The ELM keeps N − M + 1 of N layers' caches; the baselines N − M.
    let dense_kv = t.main[0].kv_bytes_1k;
    let elm = t.main.last().unwrap();
    assert!(elm.kind.starts_with("ELM"), "{elm:?}");
    assert_eq!(elm.kv_bytes_1k * 30, dense_kv * (30 - 8 + 1));
    // LLM-Streamline's FFN block attends to nothing: it keeps only the N − M kept layers' caches,
    // and holds the MLP half of one layer.
    let ffn = t
        .main
        .iter()
        .find(|r| r.model.starts_with("LLM-Streamline FFN"))
        .unwrap();
    let layer = t
        .main
        .iter()
        .find(|r| r.model.starts_with("LLM-Streamline (1 layer"))
        .unwrap();
    assert_eq!(ffn.kv_bytes_1k * 30, dense_kv * (30 - 8), "{ffn:?}");
    assert!(ffn.params < layer.params, "{ffn:?} vs {layer:?}");
    for r in &t.kv {
        assert!(r.kv_bytes > 0 && r.ratio_vs_dense > 0.0, "{r:?}");
        check_interval("kv", &r.flexible_em);
        if r.mode == "one-step" {
            let expected = (30 - r.m + 1) as f64 / 30.0;
            assert!((r.ratio_vs_dense - expected).abs() < 1e-9, "{r:?}");
        } else {
            let one =
                t.kv.iter()
                    .find(|o| o.m == r.m && o.mode == "one-step")
                    .unwrap();
            assert!(
                r.kv_bytes > one.kv_bytes,
                "multi-step must allocate more: {r:?}"
            );
        }
    }
    for r in &t.solver {
        check_interval(&r.solver, &r.answer_nll);
        assert!(r.block_evals_per_token >= 1.0, "{r:?}");
        if r.solver == "picard" {
            assert_eq!(r.compute_saved_vs_picard, 0.0);
        }
    }
    for r in &t.grad {
        assert!(
            r.seconds_per_step > 0.0 && r.peak_rss_bytes > 100 << 20,
            "{r:?}"
        );
        check_interval(&r.rule, &r.answer_nll);
    }
    for r in &t.spectral {
        assert!(r.mean_radius.is_finite() && r.mean_radius > 0.0, "{r:?}");
        assert!(r.min_radius <= r.mean_radius && r.mean_radius <= r.max_radius);
    }
    for r in &t.canonical {
        assert!(r.converged, "{r:?}");
    }
    // Table 6: GPPO and every metric selector placed in the enumeration.
    let w = t.where_to_prune.as_ref().expect("table 6");
    assert_eq!(w.num_replaced, l.m);
    assert!(w.enum_ranking.len() >= 2, "{w:?}");
    let gppo = w.gppo.as_ref().expect("GPPO row");
    // Two GPPO steps at smoke scale end before the first policy update: θ is uniform and no
    // rank correlation exists; once it moved, the correlation is a finite number.
    let probs = w.gppo_probs.as_ref().expect("GPPO probabilities");
    let uniform = probs.iter().all(|p| (p - probs[0]).abs() < 1e-12);
    assert_eq!(w.gppo_spearman.is_none(), uniform, "{w:?}");
    assert!(w.gppo_spearman.is_none_or(f64::is_finite), "{w:?}");
    assert!(!w.metrics.is_empty());
    for p in std::iter::once(gppo).chain(&w.metrics) {
        assert!(p.choice + l.m <= 30 && p.enum_rank >= 1, "{p:?}");
        assert!(
            p.enum_rank <= w.enum_ranking.len() && p.nll_gap >= 0.0,
            "{p:?}"
        );
    }
    // Table 7c: the ρ sweep with every trained ELM of table 7b marked.
    let rho = t.rho_sweep.as_ref().expect("the rho sweep");
    assert_eq!(rho.marks.len(), t.spectral.len());
    assert!(rho.rows.iter().any(|r| r.solver == "anderson"));

    // ELM + heal: a row of table 1, paired with the plain ELM at its window.
    let h = t.healed_elm.as_ref().expect("the ELM + heal comparison");
    assert!(t.main.iter().any(|r| r.model == h.healed));
    assert!(t.main.iter().any(|r| r.model == h.plain));
    check_interval("healed minus plain", &h.healed_minus_plain);

    // Tables 8 and 9: every curve at every budget, the headline rows at every seed, each
    // point's gap paired with the reference ELM of the same budget (or seed).
    let study = l.curves.as_ref().unwrap();
    let curves = t.curves.as_ref().expect("table 8 at smoke");
    let series: std::collections::BTreeSet<&str> =
        curves.points.iter().map(|p| p.series.as_str()).collect();
    // The three headline series (the reference ELM, the best healed baseline, the dense
    // reference) at every budget, the others at `steps` only.
    assert_eq!(
        curves.points.len(),
        3 * study.headline_budgets().len() + (series.len() - 3) * study.steps.len()
    );
    for s in &series {
        let n = curves.points.iter().filter(|p| p.series == *s).count();
        assert!(
            n == study.steps.len() || n == study.headline_budgets().len(),
            "{s}: {n} points"
        );
    }
    assert_eq!(curves.trends.len(), series.len());
    // The reference ELM, each healed baseline, Streamline and the dense reference (and the ELM
    // at the study's window when the reference sits elsewhere).
    assert!(series.len() >= 3 + l.healed.len(), "{series:?}");
    for p in &curves.points {
        check_interval(&p.series, &p.answer_nll);
        assert_eq!(p.minus_elm.is_none(), p.series == curves.reference, "{p:?}");
        assert!(p.tokens > 0 && p.compute_seconds > 0.0, "{p:?}");
    }
    let seeds = t.seeds.as_ref().expect("table 9 at smoke");
    assert_eq!(seeds.rows.len(), 3 * study.seeds.len());
    assert_eq!(seeds.summaries.len(), 3);
    assert_eq!(seeds.reference, curves.reference);
    // Table 10: every collapse start under both recipes, with the teacher's scale at the window
    // (positive), the losses and ρ filled in.
    assert_eq!(
        t.collapse.len(),
        2 * l.collapse_starts.len(),
        "{:?}",
        t.collapse
    );
    for r in &t.collapse {
        assert!(r.rms_entering > 0.0 && r.rms_leaving > 0.0, "{r:?}");
        assert!(
            r.first_distill.is_finite() && r.final_distill.is_finite(),
            "{r:?}"
        );
        assert!(
            r.held_out_distill.is_finite() && r.mean_radius > 0.0,
            "{r:?}"
        );
        check_interval(&format!("collapse {}", r.start), &r.answer_nll);
    }
    let recipes: std::collections::BTreeSet<&str> =
        t.collapse.iter().map(|r| r.recipe.as_str()).collect();
    assert_eq!(
        recipes,
        ["absolute", "teacher_mean_square"].into_iter().collect()
    );
    // The same start under the two recipes sees the same teacher.
    for pair in t.collapse.chunks(2) {
        assert_eq!(pair[0].start, pair[1].start);
        assert_eq!(pair[0].rms_leaving, pair[1].rms_leaving);
    }
    assert!(t.model_sha256.as_ref().is_some_and(|s| s.len() == 64));
    assert!(
        !t.model.contains('/'),
        "tables.json names the model file, not a path"
    );

    // Seed 0 at the main budget is the main table's ELM: the same figure.
    let elm0 = &seeds.rows[0];
    let main_ref = curves
        .points
        .iter()
        .find(|p| p.series == curves.reference && p.steps == l.main.steps)
        .unwrap();
    assert_eq!(elm0.answer_nll, main_ref.answer_nll);

    // At smoke scale the main and ablation budgets are equal, so the main ELM is also the
    // gradient study's SJFB row and the sweep's M = 8 model: those stages are shared.
    assert!(t.stages.iter().any(|s| !s.cached));

    // The README: every table, every cell filled (n/a only where a value cannot exist), plots.
    let readme = std::fs::read_to_string(out.join("README.md")).unwrap();
    for heading in [
        "Table 1",
        "Table 2",
        "Table 3",
        "Table 4",
        "Table 5",
        "Table 6",
        "Table 7",
        "Table 8",
        "Table 9",
        "**Paper:**",
        "Headline",
        // Smoke has learning curves: the verdict leads with their largest budget.
        "**Verdict:** At the largest budget this study trained",
        "at the best window on validation",
        "Is it the solve?",
        "Table 11",
        "Controls at the headline window",
        "validation split",
        "Table 10",
    ] {
        assert!(readme.contains(heading), "missing `{heading}`:\n{readme}");
    }
    assert!(!readme.contains("Not computed"), "{readme}");
    for line in readme.lines().filter(|l| l.starts_with('|')) {
        for cell in line.trim_matches('|').split('|').map(str::trim) {
            assert!(
                !cell.is_empty() && cell != "—" && !cell.contains("NaN") && !cell.contains("inf"),
                "placeholder cell `{cell}` in row `{line}`"
            );
        }
    }
    for plot in [
        "solver_ablation.svg",
        "compression_sweep.svg",
        "where_to_prune.svg",
        "curves_tokens.svg",
        "rho_sweep.svg",
        "curves_seconds.svg",
    ] {
        let svg = std::fs::read_to_string(out.join("plots").join(plot)).unwrap();
        assert!(svg.contains("<svg") && svg.contains("polyline"), "{plot}");
    }

    // A rerun reads every stage from the cache and writes the same tables; with --readme it
    // also rewrites the headline block of that file (and nothing else in it).
    let page = out.join("page.md");
    std::fs::write(
        &page,
        "top\n<!-- headline:begin -->\nold\n<!-- headline:end -->\nbottom\n",
    )
    .unwrap();
    let again = run(&out, &model, &["--readme", page.to_str().unwrap()]);
    let page = std::fs::read_to_string(&page).unwrap();
    assert!(
        page.starts_with("top\n<!-- headline:begin -->")
            && page.ends_with("<!-- headline:end -->\nbottom\n")
    );
    assert!(
        page.contains("**Headline") && page.contains("| model |") && !page.contains("\nold\n"),
        "{page}"
    );
    assert!(again.stages.iter().all(|s| s.cached), "{:?}", again.stages);
    assert_eq!(again.stages.len(), t.stages.len());
    assert_eq!(
        serde_json::to_value(&again.main).unwrap(),
        serde_json::to_value(&t.main).unwrap()
    );
    // `--only canonical --force` recomputes that table alone and keeps the others, their stages
    // included in the record (the README's compute time stays that of every table it shows).
    let forced = run(&out, &model, &["--only", "canonical", "--force"]);
    assert_eq!(forced.stages.len(), t.stages.len());
    let computed: Vec<_> = forced.stages.iter().filter(|s| !s.cached).collect();
    assert_eq!(computed.len(), 1, "{computed:?}");
    assert_eq!(computed[0].name, "canonical");
    assert_eq!(forced.main.len(), t.main.len());
    let _ = std::fs::remove_dir_all(&out);
}
