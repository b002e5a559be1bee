//! Tables 3–5 and 7: the solver, gradient-rule, KV-cache and spectral ablations, the sweep and
//! the throughput rows, filled from the stages of [`crate::runs`] as [`super`] fills the others.

use super::*;

pub fn solver_ablation(
    ctx: &mut Ctx<'_>,
    dense: &Dense,
    elm: &Done<Trained>,
) -> Result<Vec<SolverRow>, ReproError> {
    let tols = ctx.limits.tolerances.clone();
    let mut rows: Vec<SolverRow> = vec![];
    for &tol in &tols {
        let mut picard_evals = None;
        for solver in crate::elm_cli::SOLVERS {
            let run = runs::eval_on(
                ctx,
                &Subject::elm(elm, solver, tol),
                "gsm8k-nll",
                Problems::AblationTest,
            )?;
            let what = format!("{solver} δ={tol}");
            let (nll, delta) = nll_cells(&run.value, dense, &what)?;
            let s = &run.value.solver;
            // Kept dense layers + fixed-point evaluations = layer evaluations per token.
            let kept = (elm.value.compress.params.num_layers - elm.value.m()) as f64;
            let block = s.layer_evals_per_token - kept;
            let picard = *picard_evals.get_or_insert(block);
            rows.push(SolverRow {
                m: elm.value.m(),
                steps: elm.value.train.outcome.steps,
                solver: solver.into(),
                tol,
                mean_iterations: s.mean_iterations,
                max_iterations: s.max_iterations,
                block_evals_per_token: block,
                layer_evals_per_token: s.layer_evals_per_token,
                compute_saved_vs_picard: if picard > 0.0 {
                    1.0 - block / picard
                } else {
                    0.0
                },
                answer_nll: nll,
                delta_nll: delta,
            });
        }
    }
    Ok(rows)
}

/// The gradient rules compared in table 4, for a module replacing `m` layers.
pub fn gradient_rules(m: usize) -> Vec<(&'static str, Option<DeqConfig>)> {
    let forward = (SolverConfig::anderson(), StopCriteria::relative(1e-4, 30));
    vec![
        ("SJFB (paper default)", None),
        (
            "JFB",
            Some(
                DeqConfig::new(GradientRule::Jfb)
                    .with_forward(forward.0.clone(), forward.1.clone()),
            ),
        ),
        (
            "unroll (K = M/2 taped iterations)",
            Some(DeqConfig::new(GradientRule::Unroll { k: (m / 2).max(1) })),
        ),
        (
            "implicit (IFT, adjoint by Anderson)",
            Some(
                DeqConfig::new(GradientRule::implicit(SolverConfig::anderson(), 1e-3, 20))
                    .with_forward(forward.0, forward.1),
            ),
        ),
    ]
}

/// Table 4 rows. The main ELM is trained first so that every rule reads the same cached
/// teacher states (its batches include the study budget's), making the times comparable.
pub fn grad_ablation(
    ctx: &mut Ctx<'_>,
    dense: &Dense,
    main_elm: &Done<Trained>,
) -> Result<(Vec<GradRow>, Trainings), ReproError> {
    let l = ctx.limits.clone();
    let _ = main_elm;
    let mut rows = vec![];
    let mut trainings = vec![];
    for (name, deq) in gradient_rules(l.m) {
        let t = runs::train(ctx, &Variant::elm(l.start, l.m), &l.study, deq)?;
        let run = ablation_nll(ctx, &t)?;
        let (nll, delta) = nll_cells(&run.value, dense, name)?;
        let v = &t.value;
        rows.push(GradRow {
            rule: name.into(),
            steps: v.train.outcome.steps,
            seconds_per_step: v.seconds_per_step(),
            tokens_per_s: v.tokens_per_s(),
            peak_rss_bytes: v.train.peak_rss_bytes,
            teacher_cache_hits: v.train.teacher_cache.hits,
            teacher_cache_misses: v.train.teacher_cache.misses,
            distill_after: v.distill_after()?,
            answer_nll: nll,
            delta_nll: delta,
        });
        trainings.push((format!("ELM M={} {name} (study)", l.m), t));
    }
    Ok((rows, trainings))
}

/// Table 5 rows: an ELM (study budget) and the best training-free baseline per M; returns
/// the ELMs by M for tables 2 and 7.
pub fn sweep(
    ctx: &mut Ctx<'_>,
    dense: &Dense,
    baseline: &str,
) -> Result<(Vec<SweepRow>, ElmsByM), ReproError> {
    let l = ctx.limits.clone();
    let mut rows = vec![];
    let mut elms = vec![];
    for &m in &l.sweep {
        let t = runs::train(ctx, &Variant::elm(l.start, m), &l.study, None)?;
        let run = ablation_nll(ctx, &t)?;
        let (nll, delta) = nll_cells(&run.value, dense, &format!("ELM M={m}"))?;
        rows.push(SweepRow {
            m,
            method: "ELM".into(),
            params: t.value.compress.params.elm_total,
            non_embedding_params: t.value.compress.params.elm_non_embedding,
            kv_bytes_1k: t.value.kv_bytes_1k(),
            answer_nll: nll,
            delta_nll: delta,
        });
        let p = runs::prune(ctx, baseline, m)?;
        let subject = Subject::pruned(&p);
        let run = runs::eval_on(ctx, &subject, "gsm8k-nll", Problems::AblationTest)?;
        let (nll, delta) = nll_cells(&run.value, dense, &format!("{baseline} M={m}"))?;
        rows.push(SweepRow {
            m,
            method: baseline.into(),
            params: p.value.report.params,
            non_embedding_params: p.value.report.non_embedding_params,
            kv_bytes_1k: p.value.report.kv_bytes_1k,
            answer_nll: nll,
            delta_nll: delta,
        });
        elms.push((m, t));
    }
    Ok((rows, elms))
}

/// Table 2 rows: measured KV bytes and decoding quality, one-step vs multi-step.
pub fn kv_ablation(
    ctx: &mut Ctx<'_>,
    elms: &[(usize, Done<Trained>)],
    prompt: &str,
) -> Result<Vec<KvRow>, ReproError> {
    let kv_ms = ctx.limits.kv_ms.clone();
    let mut rows = vec![];
    for m in kv_ms {
        let Some((_, t)) = elms.iter().find(|(mm, _)| *mm == m) else {
            return Err(ReproError::Setup(format!(
                "no trained ELM with M = {m} for the KV table"
            )));
        };
        let n = t.value.compress.params.num_layers;
        let one = runs::kv_measure(ctx, t, "one-step", prompt)?;
        let per_layer = one.value.kv_bytes / (n - m + 1);
        for mode in ["one-step", "multi-step"] {
            let measured = if mode == "one-step" {
                one.value.kv_bytes
            } else {
                runs::kv_measure(ctx, t, mode, prompt)?.value.kv_bytes
            };
            let em = runs::eval(
                ctx,
                &Subject::elm(t, "anderson", 0.5).with_kv(mode),
                "gsm8k",
            )?;
            let what = format!("M={m} {mode}");
            rows.push(KvRow {
                m,
                mode: mode.into(),
                kv_bytes: measured,
                dense_kv_bytes: per_layer * n,
                ratio_vs_dense: measured as f64 / (per_layer * n) as f64,
                flexible_em: (&em.value.metric("flexible_extract", &what)?.estimate).into(),
                strict_em: (&em.value.metric("strict_match", &what)?.estimate).into(),
                mean_iterations: em.value.solver.mean_iterations,
                layer_evals_per_token: em.value.solver.layer_evals_per_token,
            });
        }
    }
    Ok(rows)
}

/// Table 7b rows.
pub fn spectral(
    ctx: &mut Ctx<'_>,
    models: &[(String, usize, &Done<Trained>)],
) -> Result<Vec<SpectralRow>, ReproError> {
    let mut rows = vec![];
    for (name, m, t) in models {
        let s = runs::spectral(ctx, t)?;
        rows.push(SpectralRow {
            model: name.clone(),
            m: *m,
            sequences: s.value.n,
            mean_radius: s.value.mean_radius,
            min_radius: s.value.min_radius,
            max_radius: s.value.max_radius,
            max_rel_residual: s.value.max_rel_residual,
        });
    }
    Ok(rows)
}

pub fn speed_rows(trainings: &[(String, Done<Trained>)]) -> Vec<SpeedRow> {
    trainings
        .iter()
        .map(|(name, t)| SpeedRow {
            training: name.clone(),
            steps: t.value.train.outcome.steps,
            tokens: t.value.train.outcome.tokens,
            seconds: t.value.train.outcome.seconds,
            tokens_per_s: t.value.tokens_per_s(),
            teacher_cache_hits: t.value.train.teacher_cache.hits,
            teacher_cache_misses: t.value.train.teacher_cache.misses,
            teacher_computed_seconds: t.value.train.teacher_cache.computed_seconds(),
            teacher_saved_seconds: t.value.train.teacher_cache.saved_seconds(),
            peak_rss_bytes: t.value.train.peak_rss_bytes,
        })
        .collect()
}
