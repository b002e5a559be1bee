//! The little dense linear algebra the canonical problems need, in pure Rust so the crate links
//! no LAPACK: a Householder QR (LAPACK's `dgeqr2` + `dorg2r` conventions, so `Q` has LAPACK's
//! column signs) and the largest singular value by power iteration on `GᵀG`. Both are checked
//! against LAPACK by the tests with the `lapack` feature.

use ndarray::{Array1, Array2, Axis};

/// The orthogonal factor `Q [n, n]` of `a = QR` for a square `a`.
pub fn householder_q(a: &Array2<f64>) -> Array2<f64> {
    let n = a.nrows();
    let mut r = a.clone();
    // Reflector k: H_k = I − τ_k v_k v_kᵀ with v_k[k] = 1, zero above k.
    let mut vs: Vec<(Array1<f64>, f64)> = Vec::with_capacity(n);
    for k in 0..n {
        let alpha = r[[k, k]];
        let xnorm = (k + 1..n)
            .map(|i| r[[i, k]] * r[[i, k]])
            .sum::<f64>()
            .sqrt();
        let mut v = Array1::zeros(n);
        v[k] = 1.0;
        if xnorm == 0.0 {
            vs.push((v, 0.0));
            continue;
        }
        let beta = -alpha.signum() * alpha.hypot(xnorm);
        let tau = (beta - alpha) / beta;
        let scale = 1.0 / (alpha - beta);
        for i in k + 1..n {
            v[i] = r[[i, k]] * scale;
        }
        // R ← H_k R on columns k.. (column k becomes (β, 0, …)).
        for j in k..n {
            let dot: f64 = (k..n).map(|i| v[i] * r[[i, j]]).sum();
            for i in k..n {
                r[[i, j]] -= tau * v[i] * dot;
            }
        }
        vs.push((v, tau));
    }
    // Q = H_0 H_1 … H_{n−1} I, applied from the last reflector backwards.
    let mut q = Array2::<f64>::eye(n);
    for (k, (v, tau)) in vs.iter().enumerate().rev() {
        if *tau == 0.0 {
            continue;
        }
        for j in k..n {
            let dot: f64 = (k..n).map(|i| v[i] * q[[i, j]]).sum();
            for i in k..n {
                q[[i, j]] -= tau * v[i] * dot;
            }
        }
    }
    q
}

/// Largest singular value of `g`: power iteration on `GᵀG` from the all-ones vector (no random
/// draws, so callers' seeded streams are unchanged), until the estimate stops moving in the last
/// bits or `max_iter` steps.
pub fn largest_singular_value(g: &Array2<f64>, max_iter: usize) -> f64 {
    let n = g.ncols();
    let mut v = Array1::<f64>::from_elem(n, 1.0 / (n as f64).sqrt());
    let mut sigma = 0.0;
    let mut still = 0;
    for _ in 0..max_iter {
        let gv = g.dot(&v);
        let w = g.t().dot(&gv);
        let norm = w.dot(&w).sqrt();
        if norm == 0.0 {
            return 0.0;
        }
        // ‖G v‖ with ‖v‖ = 1 is the Rayleigh estimate of σ_max; it rises monotonically.
        let next = gv.dot(&gv).sqrt();
        v = w / norm;
        if (next - sigma).abs() <= 1e-15 * next {
            still += 1;
            if still >= 3 {
                return next;
            }
        } else {
            still = 0;
        }
        sigma = next;
    }
    sigma
}

/// `Q diag(d) Qᵀ x` for each row `x` of `xs [B, n]`.
pub fn apply_eigen(q: &Array2<f64>, d: &Array1<f64>, xs: &Array2<f64>) -> Array2<f64> {
    let coeffs = xs.dot(q) * d.view().insert_axis(Axis(0));
    coeffs.dot(&q.t())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;
    use rand_distr::{Distribution, StandardNormal};

    fn gaussian(n: usize, seed: u64) -> Array2<f64> {
        let mut rng = StdRng::seed_from_u64(seed);
        Array2::from_shape_simple_fn((n, n), || StandardNormal.sample(&mut rng))
    }

    fn max_abs(a: &Array2<f64>) -> f64 {
        a.iter().fold(0.0, |m, v| m.max(v.abs()))
    }

    /// Q is orthogonal and QᵀG is upper triangular (so G = QR): the definition, not a reference.
    #[test]
    fn householder_q_is_the_orthogonal_factor() {
        for n in [2, 7, 100] {
            let g = gaussian(n, n as u64);
            let q = householder_q(&g);
            let eye = Array2::<f64>::eye(n);
            assert!(max_abs(&(q.t().dot(&q) - &eye)) < 1e-13, "n={n}: QᵀQ ≠ I");
            let r = q.t().dot(&g);
            for i in 0..n {
                for j in 0..i {
                    assert!(r[[i, j]].abs() < 1e-12, "n={n}: R[{i},{j}] = {}", r[[i, j]]);
                }
            }
        }
    }

    /// σ_max of U diag(s) Vᵀ is max(s), for s with a small gap at the top.
    #[test]
    fn power_iteration_finds_the_largest_singular_value() {
        let n = 60;
        let u = householder_q(&gaussian(n, 1));
        let v = householder_q(&gaussian(n, 2));
        let s = Array1::from_shape_fn(n, |i| 3.0 - 2.0 * i as f64 / n as f64);
        let g = (&u * &s).dot(&v.t());
        let sigma = largest_singular_value(&g, 100_000);
        assert!((sigma - 3.0).abs() < 1e-12, "σ_max {sigma}");
    }

    #[test]
    fn apply_eigen_inverts_i_minus_a() {
        let n = 30;
        let q = householder_q(&gaussian(n, 3));
        let lambda = Array1::linspace(-0.9, 0.9, n);
        let a = (&q * &lambda).dot(&q.t());
        let b = gaussian(n, 4).slice_move(ndarray::s![0..2, ..]);
        let x = apply_eigen(&q, &lambda.mapv(|l| 1.0 / (1.0 - l)), &b);
        // (I − A) x = b, row by row.
        let back = &x - &x.dot(&a.t());
        assert!(max_abs(&(back - &b)) < 1e-12);
    }

    /// With `lapack`: the same Q (column signs included) and σ_max as LAPACK's QR and SVD.
    #[cfg(feature = "lapack")]
    #[test]
    fn matches_lapack() {
        use ndarray_linalg::{QR, SVD};
        let g = gaussian(100, 5);
        let (q_ref, _) = g.qr().unwrap();
        assert!(max_abs(&(householder_q(&g) - &q_ref)) < 1e-12);
        let (_, sv, _) = g.svd(false, false).unwrap();
        let sigma = largest_singular_value(&g, 100_000);
        assert!(
            (sigma - sv[0]).abs() < 1e-11 * sv[0],
            "{sigma} vs {}",
            sv[0]
        );
    }
}
