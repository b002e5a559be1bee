//! `team::SpinTeam` and the batch-1 matvec kernel that runs on it.

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use elm::model::ops::matvecs_split;
use elm::team::{SpinTeam, SPIN_BEFORE_PARK};
use ndarray::{Array1, Array2};
use rand::{rngs::StdRng, Rng, SeedableRng};

#[test]
fn every_part_runs_once_per_job() {
    let team = SpinTeam::new(3);
    assert_eq!(team.parts(), 4);
    let hits: Vec<AtomicUsize> = (0..team.parts()).map(|_| AtomicUsize::new(0)).collect();
    for _ in 0..1000 {
        team.try_run(&|p| {
            hits[p].fetch_add(1, Ordering::Relaxed);
        })
        .expect("team is free");
    }
    for (p, h) in hits.iter().enumerate() {
        assert_eq!(h.load(Ordering::Relaxed), 1000, "part {p}");
    }
}

#[test]
fn helpers_wake_after_parking() {
    let team = SpinTeam::new(1);
    let count = AtomicUsize::new(0);
    for _ in 0..3 {
        std::thread::sleep(SPIN_BEFORE_PARK * 4);
        team.try_run(&|_| {
            count.fetch_add(1, Ordering::Relaxed);
        })
        .expect("team is free");
    }
    assert_eq!(count.load(Ordering::Relaxed), 6);
}

#[test]
fn busy_team_declines_a_second_caller() {
    let team = SpinTeam::new(1);
    let declined = AtomicBool::new(false);
    team.try_run(&|p| {
        if p == 0 {
            declined.store(team.try_run(&|_| {}).is_none(), Ordering::Relaxed);
        }
    })
    .expect("team is free");
    assert!(declined.load(Ordering::Relaxed));
}

#[test]
fn helper_panic_reaches_the_caller_and_team_survives() {
    let team = SpinTeam::new(1);
    let r = catch_unwind(AssertUnwindSafe(|| {
        team.try_run(&|p| assert_eq!(p, 0, "helper part fails on purpose"));
    }));
    assert!(r.is_err(), "the helper's panic must reach the caller");
    let count = AtomicUsize::new(0);
    team.try_run(&|_| {
        count.fetch_add(1, Ordering::Relaxed);
    })
    .expect("team is usable after a panic");
    assert_eq!(count.load(Ordering::Relaxed), 2);
}

/// `y_i = W_i · x` of `matvecs_split` vs an f64 reference, for widths around the
/// kernel's 8- and 64-wide blocks and row counts on both sides of the split threshold.
#[test]
fn matvecs_split_matches_f64_reference() {
    let mut rng = StdRng::seed_from_u64(7);
    for &cols in &[1usize, 7, 8, 9, 63, 64, 65, 130, 576, 1000] {
        for &rows in &[1usize, 3, 63, 64, 200] {
            let x = Array1::from_shape_fn(cols, |_| rng.gen_range(-1.0f32..1.0));
            let ws: Vec<Array2<f32>> = (0..3)
                .map(|k| Array2::from_shape_fn((rows + k, cols), |_| rng.gen_range(-1.0f32..1.0)))
                .collect();
            let mut ys: Vec<Array1<f32>> = ws.iter().map(|w| Array1::zeros(w.nrows())).collect();
            {
                let mut jobs: Vec<_> = ws
                    .iter()
                    .map(|w| w.view())
                    .zip(ys.iter_mut().map(|y| y.view_mut()))
                    .collect();
                matvecs_split(x.view(), &mut jobs);
            }
            for (w, y) in ws.iter().zip(&ys) {
                let mut max_abs = 0.0f64;
                for (r, &got) in y.iter().enumerate() {
                    let want: f64 = w
                        .row(r)
                        .iter()
                        .zip(&x)
                        .map(|(&a, &b)| a as f64 * b as f64)
                        .sum();
                    let scale: f64 = w
                        .row(r)
                        .iter()
                        .zip(&x)
                        .map(|(&a, &b)| (a as f64 * b as f64).abs())
                        .sum();
                    let err = (got as f64 - want).abs() / scale.max(1e-30);
                    max_abs = max_abs.max(err);
                }
                assert!(
                    max_abs < 4e-6,
                    "rows {} cols {cols}: max error relative to Σ|w·x| = {max_abs:e}",
                    w.nrows()
                );
            }
        }
    }
}

/// While another thread holds the global team, `matvecs_split` falls back to rayon
/// and gives the same result.
#[test]
fn matvecs_split_falls_back_when_team_is_busy() {
    let mut rng = StdRng::seed_from_u64(11);
    let w = Array2::from_shape_fn((300, 576), |_| rng.gen_range(-1.0f32..1.0));
    let x = Array1::from_shape_fn(576, |_| rng.gen_range(-1.0f32..1.0));
    let mut free = Array1::zeros(300);
    matvecs_split(x.view(), &mut [(w.view(), free.view_mut())]);
    let busy = std::sync::Mutex::new(Array1::<f32>::zeros(300));
    let team = SpinTeam::global();
    let ran = team.try_run(&|p| {
        if p == 0 {
            let mut y = busy.lock().unwrap();
            matvecs_split(x.view(), &mut [(w.view(), y.view_mut())]);
        }
    });
    if !common::optional(
        "an idle global team",
        ran.is_some(),
        "the global team was busy with another test",
    ) {
        return;
    }
    assert_eq!(free, *busy.lock().unwrap(), "busy-team fallback differs");
}
