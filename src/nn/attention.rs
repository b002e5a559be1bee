//! Causal grouped-query attention, fused forward/backward, with an optional KV prefix.
//!
//! Query head `h` reads KV head `h / (H / KV)`. With `S = P + T` keys (a prefix of `P`
//! cached positions followed by the `T` current ones), query `t` attends to keys
//! `s ≤ P + t`; with a sliding window `w` (Gemma 3's local layers) only the last `w` of them,
//! `P + t − w < s ≤ P + t`. Scores are scaled by `1/sqrt(D)`.

use ndarray::{s, Array2, Array4, ArrayD, Ix4};
use rayon::prelude::*;

use crate::autograd::ops::standard;
use crate::autograd::{AdFloat, Tape, Var};
use crate::error::{ElmError, Result};

/// The first key a query that sees `visible` keys (itself the last) attends to: 0, or the start
/// of its sliding window of `window` keys. The one definition of the window, which the cached
/// inference path (`crate::model::block`) reads too.
pub fn first_visible(visible: usize, window: Option<usize>) -> usize {
    window.map_or(0, |w| visible.saturating_sub(w))
}

/// Softmax probabilities kept for backward: `[B, H, T, S]`.
#[derive(Clone, Debug)]
pub struct AttentionCache<T> {
    pub probs: Array4<T>,
}

#[allow(clippy::type_complexity)]
fn dims<T4: AdFloat>(
    q: &ArrayD<T4>,
    k: &ArrayD<T4>,
    v: &ArrayD<T4>,
) -> Result<(usize, usize, usize, usize, usize, usize)> {
    let bad = || {
        ElmError::shape(
            "attention",
            format!(
                "need q [B,T,H,D], k/v [B,S,KV,D] with S ≥ T and KV | H; got q {:?}, k {:?}, v {:?}",
                q.shape(),
                k.shape(),
                v.shape()
            ),
        )
    };
    if q.ndim() != 4 || k.ndim() != 4 || k.shape() != v.shape() {
        return Err(bad());
    }
    let (b, t, h, d) = (q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]);
    let (bk, s, kv, dk) = (k.shape()[0], k.shape()[1], k.shape()[2], k.shape()[3]);
    if b != bk || d != dk || s < t || kv == 0 || h % kv != 0 {
        return Err(bad());
    }
    Ok((b, t, h, d, s, kv))
}

/// `q: [B, T, H, D]`, `k, v: [B, S, KV, D]` → `(out: [B, T, H, D], cache)`; `window`:
/// each query sees at most its last `window` keys (itself included).
pub fn forward<T4: AdFloat>(
    q: &ArrayD<T4>,
    k: &ArrayD<T4>,
    v: &ArrayD<T4>,
    window: Option<usize>,
) -> Result<(ArrayD<T4>, AttentionCache<T4>)> {
    let (b, t, h, d, s_len, kv) = dims(q, k, v)?;
    if window == Some(0) {
        return Err(ElmError::shape(
            "attention",
            "a sliding window must hold at least one key",
        ));
    }
    let group = h / kv;
    let prefix = s_len - t;
    let scale = T4::one() / T4::of(d as f64).sqrt();
    let q4 = q.view().into_dimensionality::<Ix4>().unwrap();
    let k4 = k.view().into_dimensionality::<Ix4>().unwrap();
    let v4 = v.view().into_dimensionality::<Ix4>().unwrap();
    // Independent (batch, head) pairs run in parallel.
    let per_head: Vec<(Array2<T4>, Array2<T4>)> = (0..b * h)
        .into_par_iter()
        .map(|bh| {
            let (bi, hi) = (bh / h, bh % h);
            let kvh = hi / group;
            let qh = q4.slice(s![bi, .., hi, ..]); // [T, D]
            let kh = k4.slice(s![bi, .., kvh, ..]); // [S, D]
            let vh = v4.slice(s![bi, .., kvh, ..]); // [S, D]
            let mut sc: Array2<T4> = T4::matmul_full_precision(&qh.view(), &kh.t()) * scale; // [T, S]
            for (ti, mut row) in sc.rows_mut().into_iter().enumerate() {
                let last = prefix + ti; // last visible key
                let first = first_visible(last + 1, window);
                let m = row
                    .slice(s![first..=last])
                    .fold(T4::neg_infinity(), |a, &x| a.max(x));
                let row = row
                    .as_slice_mut()
                    .expect("a row of a fresh array is contiguous");
                let (seen, dead) = row.split_at_mut(last + 1);
                let (before, live) = seen.split_at_mut(first);
                live.iter_mut().for_each(|x| *x -= m);
                T4::exp_in_place(live);
                before.fill(T4::zero());
                dead.fill(T4::zero());
                let sum: T4 = live.iter().copied().sum();
                live.iter_mut().for_each(|x| *x /= sum);
            }
            let o = T4::matmul_full_precision(&sc.view(), &vh.view());
            (o, sc)
        })
        .collect();
    let mut out = Array4::<T4>::zeros((b, t, h, d));
    let mut probs = Array4::<T4>::zeros((b, h, t, s_len));
    for (bh, (o, p)) in per_head.into_iter().enumerate() {
        let (bi, hi) = (bh / h, bh % h);
        out.slice_mut(s![bi, .., hi, ..]).assign(&o);
        probs.slice_mut(s![bi, hi, .., ..]).assign(&p);
    }
    Ok((out.into_dyn(), AttentionCache { probs }))
}

/// Returns `(dq, dk, dv)` for upstream `dout: [B, T, H, D]`.
pub fn backward<T4: AdFloat>(
    q: &ArrayD<T4>,
    k: &ArrayD<T4>,
    v: &ArrayD<T4>,
    cache: &AttentionCache<T4>,
    dout: &ArrayD<T4>,
) -> (ArrayD<T4>, ArrayD<T4>, ArrayD<T4>) {
    let (b, t, h, d) = (q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]);
    let (s_len, kv) = (k.shape()[1], k.shape()[2]);
    let group = h / kv;
    let scale = T4::one() / T4::of(d as f64).sqrt();
    let q4 = q.view().into_dimensionality::<Ix4>().unwrap();
    let k4 = k.view().into_dimensionality::<Ix4>().unwrap();
    let v4 = v.view().into_dimensionality::<Ix4>().unwrap();
    let dout = standard(dout.clone());
    let do4 = dout.view().into_dimensionality::<Ix4>().unwrap();
    // Per (batch, head): dq, and this head's contribution to its KV head's dk, dv.
    let per_head: Vec<(Array2<T4>, Array2<T4>, Array2<T4>)> = (0..b * h)
        .into_par_iter()
        .map(|bh| {
            let (bi, hi) = (bh / h, bh % h);
            let kvh = hi / group;
            let p = cache.probs.slice(s![bi, hi, .., ..]); // [T, S]
            let qh = q4.slice(s![bi, .., hi, ..]);
            let kh = k4.slice(s![bi, .., kvh, ..]);
            let vh = v4.slice(s![bi, .., kvh, ..]);
            let doh = do4.slice(s![bi, .., hi, ..]); // [T, D]
                                                     // out = P V → dV = Pᵀ dO, dP = dO Vᵀ.
            let dvh = T4::matmul_full_precision(&p.t(), &doh.view());
            let mut ds = T4::matmul_full_precision(&doh.view(), &vh.t()); // [T, S]
                                                                          // Softmax VJP per row; masked entries have p = 0 and get 0.
            for (mut dsr, pr) in ds.rows_mut().into_iter().zip(p.rows()) {
                let dot: T4 = dsr.iter().zip(pr.iter()).map(|(&a, &b)| a * b).sum();
                dsr.zip_mut_with(&pr, |x, &pi| *x = pi * (*x - dot) * scale);
            }
            (
                T4::matmul_full_precision(&ds.view(), &kh.view()),
                T4::matmul_full_precision(&ds.t(), &qh.view()),
                dvh,
            )
        })
        .collect();
    let mut dq = Array4::<T4>::zeros((b, t, h, d));
    let mut dk = Array4::<T4>::zeros((b, s_len, kv, d));
    let mut dv = Array4::<T4>::zeros((b, s_len, kv, d));
    for (bh, (dqh, dkh, dvh)) in per_head.into_iter().enumerate() {
        let (bi, hi) = (bh / h, bh % h);
        let kvh = hi / group;
        dq.slice_mut(s![bi, .., hi, ..]).assign(&dqh);
        let mut dk_slot = dk.slice_mut(s![bi, .., kvh, ..]);
        dk_slot += &dkh;
        let mut dv_slot = dv.slice_mut(s![bi, .., kvh, ..]);
        dv_slot += &dvh;
    }
    (dq.into_dyn(), dk.into_dyn(), dv.into_dyn())
}

/// Tape op: causal GQA. `q: [B, T, H, D]`, `k, v: [B, T, KV, D]` for the current tokens,
/// plus an optional `(k_prefix, v_prefix): [B, P, KV, D]` (earlier positions, e.g. a KV
/// cache or learned prefix) placed before them; gradients flow into the prefix too.
/// `window`: a sliding window (see [`forward`]); masked keys get zero gradient.
pub fn attention<T: AdFloat>(
    tape: &mut Tape<T>,
    q: Var,
    k: Var,
    v: Var,
    kv_prefix: Option<(Var, Var)>,
    window: Option<usize>,
) -> Result<Var> {
    let (k_all, v_all) = match kv_prefix {
        None => (k, v),
        Some((kp, vp)) => (concat_time(tape, kp, k)?, concat_time(tape, vp, v)?),
    };
    let (qs, ks, vs) = (tape.shared(q), tape.shared(k_all), tape.shared(v_all));
    let (out, cache) = forward(&qs, &ks, &vs, window)?;
    let bytes = cache.probs.len() * std::mem::size_of::<T>();
    Ok(
        tape.push_op(&[q, k_all, v_all], out, bytes, move |dy, needs| {
            let (dq, dk, dv) = backward(&qs, &ks, &vs, &cache, dy);
            Ok(vec![
                needs[0].then_some(dq),
                needs[1].then_some(dk),
                needs[2].then_some(dv),
            ])
        }),
    )
}

/// Concatenates `[B, P, KV, D]` and `[B, T, KV, D]` along time (axis 1).
pub fn concat_time<T: AdFloat>(tape: &mut Tape<T>, a: Var, b: Var) -> Result<Var> {
    let (av, bv) = (tape.shared(a), tape.shared(b));
    let ok = av.ndim() == 4 && bv.ndim() == 4 && {
        let (sa, sb) = (av.shape(), bv.shape());
        sa[0] == sb[0] && sa[2] == sb[2] && sa[3] == sb[3]
    };
    if !ok {
        return Err(ElmError::shape(
            "attention kv prefix",
            format!("prefix {:?} vs current {:?}", av.shape(), bv.shape()),
        ));
    }
    let p = av.shape()[1];
    let y = ndarray::concatenate(ndarray::Axis(1), &[av.view(), bv.view()]).unwrap();
    drop((av, bv));
    Ok(tape.push_op(&[a, b], standard(y), 0, move |g, needs| {
        Ok(vec![
            needs[0].then(|| g.slice(s![.., ..p, .., ..]).to_owned().into_dyn()),
            needs[1].then(|| g.slice(s![.., p.., .., ..]).to_owned().into_dyn()),
        ])
    }))
}
