//! Bootstrap intervals against analytic (normal-theory) intervals, and paired comparisons.

use elm::eval::stats::{estimate, exact_mcnemar, paired, BootstrapConfig, ItemScore};

fn bernoulli(n: usize, hits: usize) -> Vec<ItemScore> {
    (0..n)
        .map(|i| ItemScore {
            id: i.to_string(),
            value: f64::from(u8::from(i < hits)),
            weight: 1.0,
        })
        .collect()
}

#[test]
fn accuracy_interval_matches_the_normal_approximation() {
    // p = 0.3, n = 1000: p ± 1.96·sqrt(p(1−p)/n) = ±0.0284.
    let items = bernoulli(1000, 300);
    let e = estimate(
        &items,
        &BootstrapConfig {
            resamples: 4000,
            ..Default::default()
        },
    )
    .unwrap();
    let half = 1.96 * (0.3f64 * 0.7 / 1000.0).sqrt();
    assert!((e.value - 0.3).abs() < 1e-12);
    assert!((e.lo - (0.3 - half)).abs() < 0.004, "{e:?}");
    assert!((e.hi - (0.3 + half)).abs() < 0.004, "{e:?}");
    assert_eq!(e.n, 1000);
    // Seeded: the same config gives the same interval.
    let again = estimate(
        &items,
        &BootstrapConfig {
            resamples: 4000,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(e, again);
}

#[test]
fn ratio_estimator_weights_items_by_tokens() {
    // Mean NLL per token = Σ nll / Σ tokens, not the mean of per-item means.
    let items = vec![
        ItemScore {
            id: "a".into(),
            value: 10.0,
            weight: 10.0,
        },
        ItemScore {
            id: "b".into(),
            value: 30.0,
            weight: 10.0,
        },
        ItemScore {
            id: "c".into(),
            value: 2.0,
            weight: 1.0,
        },
    ];
    let e = estimate(&items, &BootstrapConfig::default()).unwrap();
    assert!((e.value - 42.0 / 21.0).abs() < 1e-12);
    assert!(e.lo <= e.value && e.value <= e.hi && e.lo < e.hi);
}

#[test]
fn paired_difference_cancels_shared_item_variation() {
    // Items of very different difficulty; the model is worse by exactly 0.1 nats on each.
    let reference: Vec<ItemScore> = (0..200)
        .map(|i| ItemScore {
            id: i.to_string(),
            value: (i % 17) as f64,
            weight: 1.0,
        })
        .collect();
    let model: Vec<ItemScore> = reference
        .iter()
        .rev() // order does not matter: items are matched by id
        .map(|r| ItemScore {
            value: r.value + 0.1,
            ..r.clone()
        })
        .collect();
    let p = paired(&model, &reference, &BootstrapConfig::default()).unwrap();
    assert!((p.delta.value - 0.1).abs() < 1e-9);
    assert!(
        (p.delta.lo - 0.1).abs() < 1e-9 && (p.delta.hi - 0.1).abs() < 1e-9,
        "{:?}",
        p.delta
    );
    assert_eq!(p.verdict, "higher");
    // Unpaired, each figure's own interval is wide and the two overlap.
    assert!(p.model.lo < p.reference.hi);
    // Identical models: Δ = 0 exactly, indistinguishable, ratio 1.
    let same = paired(&reference, &reference, &BootstrapConfig::default()).unwrap();
    assert_eq!((same.delta.lo, same.delta.hi), (0.0, 0.0));
    assert_eq!(same.verdict, "indistinguishable");
    assert!((same.ratio.unwrap().value - 1.0).abs() < 1e-12);
}

#[test]
fn bad_inputs_are_errors() {
    let cfg = BootstrapConfig::default();
    assert!(estimate(&[], &cfg).is_err());
    let a = bernoulli(10, 3);
    let mut b = bernoulli(10, 5);
    b[0].id = "other".into();
    assert!(paired(&a, &b, &cfg)
        .unwrap_err()
        .to_string()
        .contains("no reference score"));
    assert!(paired(&a, &bernoulli(9, 3), &cfg).is_err());
    let nan = vec![ItemScore {
        id: "x".into(),
        value: f64::NAN,
        weight: 1.0,
    }];
    assert!(estimate(&nan, &cfg).is_err());
    assert!(estimate(
        &a,
        &BootstrapConfig {
            resamples: 0,
            ..cfg
        }
    )
    .is_err());
}

#[test]
fn spread_matches_the_textbook_sample_standard_deviation() {
    use elm::eval::stats::spread;
    // 2, 4, 4, 4, 5, 5, 7, 9: mean 5, sum of squares 32, sample sd sqrt(32 / 7).
    let s = spread(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]).unwrap();
    assert_eq!((s.n, s.mean, s.min, s.max), (8, 5.0, 2.0, 9.0));
    assert!((s.sd - (32.0f64 / 7.0).sqrt()).abs() < 1e-12);
    assert_eq!(spread(&[1.5]).unwrap().sd, 0.0);
    assert!(spread(&[]).is_err());
    assert!(spread(&[1.0, f64::NAN]).is_err());
}

#[test]
fn least_squares_line_recovers_an_exact_line_and_refuses_degenerate_input() {
    use elm::eval::stats::least_squares_line;
    let x = [0.0, 1.0, 2.0, 3.0];
    let y: Vec<f64> = x.iter().map(|v| 1.25 - 0.5 * v).collect();
    let (a, b) = least_squares_line(&x, &y).unwrap();
    assert!((a - 1.25).abs() < 1e-12 && (b + 0.5).abs() < 1e-12);
    // Noisy points symmetric about the line y = x: the fit is exact (normal equations by hand).
    let (a, b) = least_squares_line(&[0.0, 1.0, 2.0], &[0.1, 0.8, 2.1]).unwrap();
    assert!((b - 1.0).abs() < 1e-12 && a.abs() < 1e-12, "{a} {b}");
    assert!(least_squares_line(&[1.0, 1.0], &[0.0, 1.0]).is_err());
    assert!(least_squares_line(&[1.0], &[0.0]).is_err());
    assert!(least_squares_line(&[0.0, 1.0], &[0.0]).is_err());
}

/// The references are SciPy 1.x (`scipy.stats.norm.ppf`, `binomtest(...).proportion_ci(method
/// = "wilson")`, `binomtest(k, n, 0.5).pvalue`), computed once outside this repository.
#[test]
fn wilson_intervals_and_mcnemar_match_scipy() {
    use elm::eval::stats::{mcnemar, normal_quantile, wilson};
    for (p, z) in [
        (0.975, 1.959963984540054),
        (0.995, 2.5758293035489004),
        (0.01, -2.3263478740408408),
    ] {
        assert!((normal_quantile(p) - z).abs() < 1e-8, "Φ⁻¹({p})");
    }
    for (k, n, lo, hi) in [
        (0, 16, 0.0, 0.1936076805344365),
        (5, 20, 0.11186170140766571, 0.468700877618744),
        (300, 1319, 0.2056336510291822, 0.25083938645712056),
    ] {
        let e = wilson(k, n, 0.95).unwrap();
        assert!(
            (e.lo - lo).abs() < 1e-8 && (e.hi - hi).abs() < 1e-8,
            "{k}/{n}: {e:?}"
        );
        assert!(
            k > 0 || e.lo == 0.0,
            "0 successes: the lower bound is exactly 0"
        );
        assert_eq!(e.value, k as f64 / n as f64);
    }
    assert!(wilson(3, 2, 0.95).is_err() && wilson(0, 0, 0.95).is_err());
    // McNemar over paired 0/1 items: only the discordant ones count.
    let pair = |model_only: usize, reference_only: usize, both: usize| {
        let mut m = vec![];
        let mut r = vec![];
        let mut push = |a: f64, b: f64| {
            let id = m.len().to_string();
            m.push(ItemScore {
                id: id.clone(),
                value: a,
                weight: 1.0,
            });
            r.push(ItemScore {
                id,
                value: b,
                weight: 1.0,
            });
        };
        (0..model_only).for_each(|_| push(1.0, 0.0));
        (0..reference_only).for_each(|_| push(0.0, 1.0));
        (0..both).for_each(|_| push(1.0, 1.0));
        (m, r)
    };
    for (b, c, p) in [
        (5, 0, 0.0625),
        (11, 3, 0.057373046875),
        (90, 40, 1.3715068445175432e-05),
        (0, 0, 1.0),
    ] {
        let (m, r) = pair(b, c, 7);
        let t = mcnemar(&m, &r).unwrap();
        assert_eq!((t.model_only, t.reference_only), (b, c));
        assert!(
            (t.p_value - p).abs() < 1e-9 * p.max(1e-3),
            "{b}/{c}: {}",
            t.p_value
        );
    }
    let (m, mut r) = pair(1, 1, 0);
    r[0].value = 0.5;
    assert!(
        mcnemar(&m, &r).is_err(),
        "a score that is not 0/1 is refused"
    );
}

#[test]
fn exact_mcnemar_is_the_two_sided_binomial_tail_of_the_discordant_items() {
    // By hand: b = 3, c = 0 → 2 · (1/2)^3 = 0.25; b = 10, c = 2 → 2 · (1 + 12 + 66) / 4096;
    // b = c → at least 1, capped at 1; no discordant item → 1.
    assert!((exact_mcnemar(3, 0) - 0.25).abs() < 1e-15);
    assert!((exact_mcnemar(10, 2) - 2.0 * 79.0 / 4096.0).abs() < 1e-15);
    assert!((exact_mcnemar(2, 10) - exact_mcnemar(10, 2)).abs() < 1e-15);
    assert_eq!(exact_mcnemar(1, 1), 1.0);
    assert_eq!(exact_mcnemar(0, 0), 1.0);
    // Thousands of discordant items: 2^-2000 underflows a plain sum, not the log-space one.
    // b = 1000, c = 1000 is the centre (p = 1); b = 2000, c = 0 is 2 · 2^-2000 (0 in f64).
    assert_eq!(exact_mcnemar(1000, 1000), 1.0);
    let p = exact_mcnemar(1100, 900);
    assert!(p > 0.0 && p < 1e-5 && p.is_finite(), "{p}");
    assert_eq!(exact_mcnemar(2000, 0), 0.0);
}

#[test]
fn paired_proportions_carry_the_exact_mcnemar_p_value() {
    let item = |id: usize, v: f64| ItemScore {
        id: id.to_string(),
        value: v,
        weight: 1.0,
    };
    // Model right on 0..5, reference right on 4..6: discordant b = 4 (0..4), c = 1 (5).
    let model: Vec<ItemScore> = (0..8)
        .map(|i| item(i, f64::from(u8::from(i < 5))))
        .collect();
    let reference: Vec<ItemScore> = (0..8)
        .map(|i| item(i, f64::from(u8::from((4..6).contains(&i)))))
        .collect();
    let p = paired(&model, &reference, &BootstrapConfig::default()).unwrap();
    // 2 · (C(5,0) + C(5,1)) / 32 = 12/32.
    assert!((p.exact_mcnemar_p.unwrap() - 0.375).abs() < 1e-15, "{p:?}");
    // Continuous scores (an NLL) have no McNemar test.
    let nll: Vec<ItemScore> = (0..8).map(|i| item(i, 0.5 + i as f64)).collect();
    assert!(paired(&nll, &nll, &BootstrapConfig::default())
        .unwrap()
        .exact_mcnemar_p
        .is_none());
}
