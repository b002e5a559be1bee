//! Losses: token cross-entropy with an ignore index, masked mean-squared error.

use ndarray::{ArrayD, Axis, IxDyn};

use crate::autograd::ops::{as_2d, standard};
use crate::autograd::{AdFloat, Tape, Var};
use crate::error::{ElmError, Result};

/// Target value that excludes a position from the loss (HF convention).
pub const IGNORE_INDEX: i64 = -100;

fn check_ce<T: AdFloat>(
    logits: &ArrayD<T>,
    targets: &[i64],
    ignore_index: i64,
) -> Result<(usize, usize)> {
    let v = logits.shape().last().copied().unwrap_or(0);
    let rows = logits.len().checked_div(v).unwrap_or(0);
    if logits.ndim() < 1 || v == 0 || rows != targets.len() {
        return Err(ElmError::shape(
            "cross_entropy",
            format!("logits {:?} vs {} targets", logits.shape(), targets.len()),
        ));
    }
    if let Some(&bad) = targets
        .iter()
        .find(|&&t| t != ignore_index && (t < 0 || t as usize >= v))
    {
        return Err(ElmError::InvalidArgument(format!(
            "cross_entropy target {bad} outside [0, {v}) and not the ignore index {ignore_index}"
        )));
    }
    Ok((rows, v))
}

/// Mean over counted positions of `logsumexp(logits) − logits[target]`.
/// `logits: [..., V]`, `targets`: one per row. Returns `(loss, counted)`; `counted = 0` gives loss 0.
pub fn cross_entropy_forward<T: AdFloat>(
    logits: &ArrayD<T>,
    targets: &[i64],
    ignore_index: i64,
) -> Result<(T, usize)> {
    check_ce(logits, targets, ignore_index)?;
    let l = standard(logits.clone());
    let mut total = T::zero();
    let mut counted = 0;
    // One row's exponentials (reused across rows).
    let mut e: Vec<T> = Vec::new();
    for (row, &t) in as_2d(&l).rows().into_iter().zip(targets) {
        if t == ignore_index {
            continue;
        }
        let m = row.fold(T::neg_infinity(), |a, &b| a.max(b));
        e.clear();
        e.extend(row.iter().map(|&x| x - m));
        T::exp_in_place(&mut e);
        let lse = m + e.iter().copied().sum::<T>().ln();
        total += lse - row[t as usize];
        counted += 1;
    }
    let loss = if counted == 0 {
        T::zero()
    } else {
        total / T::of(counted as f64)
    };
    Ok((loss, counted))
}

/// `dlogits = dloss / counted · (softmax(logits) − onehot(target))` on counted rows, 0 elsewhere.
/// Recomputes the softmax instead of caching `[N, V]` probabilities.
pub fn cross_entropy_backward<T: AdFloat>(
    logits: &ArrayD<T>,
    targets: &[i64],
    ignore_index: i64,
    counted: usize,
    dloss: T,
) -> ArrayD<T> {
    let mut d = standard(logits.clone());
    if counted == 0 {
        d.fill(T::zero());
        return d;
    }
    let k = dloss / T::of(counted as f64);
    let nd = d.ndim();
    for (mut row, &t) in d.lanes_mut(Axis(nd - 1)).into_iter().zip(targets) {
        if t == ignore_index {
            row.fill(T::zero());
            continue;
        }
        let m = row.fold(T::neg_infinity(), |a, &b| a.max(b));
        row.mapv_inplace(|x| x - m);
        // `standard` made the rows contiguous.
        match row.as_slice_mut() {
            Some(xs) => T::exp_in_place(xs),
            None => row.mapv_inplace(|x| x.exp()),
        }
        let s = row.sum();
        row.mapv_inplace(|x| x / s * k);
        row[t as usize] -= k;
    }
    d
}

/// Tape op: scalar cross-entropy (mean over positions whose target ≠ `ignore_index`).
pub fn cross_entropy<T: AdFloat>(
    tape: &mut Tape<T>,
    logits: Var,
    targets: &[i64],
    ignore_index: i64,
) -> Result<Var> {
    let ls = tape.shared(logits);
    let (loss, counted) = cross_entropy_forward(&ls, targets, ignore_index)?;
    let targets = targets.to_vec();
    let bytes = targets.len() * 8;
    Ok(tape.push_op(
        &[logits],
        ArrayD::from_elem(IxDyn(&[]), loss),
        bytes,
        move |g, _| {
            let g0 = *g.iter().next().unwrap();
            Ok(vec![Some(cross_entropy_backward(
                &ls,
                &targets,
                ignore_index,
                counted,
                g0,
            ))])
        },
    ))
}

/// Cross-entropy of `head(x)` at the supervised positions only: the rows of `x` `[..., C]`
/// whose target is not `ignore_index` are gathered first (`[R, C]`), so `head` — e.g. the final
/// norm and the LM head, the largest matmul of a training step — runs on those rows alone.
/// Loss and gradients equal running `head` everywhere and ignoring the other rows, as long as
/// `head` acts on each row separately. Returns `(loss, R)`; no supervised row is an error.
pub fn supervised_cross_entropy<T: AdFloat>(
    tape: &mut Tape<T>,
    x: Var,
    targets: &[i64],
    ignore_index: i64,
    head: impl FnOnce(&mut Tape<T>, Var) -> Result<Var>,
) -> Result<(Var, usize)> {
    let (rows, kept): (Vec<usize>, Vec<i64>) = targets
        .iter()
        .enumerate()
        .filter(|(_, &t)| t != ignore_index)
        .map(|(i, &t)| (i, t))
        .unzip();
    if rows.is_empty() {
        return Err(ElmError::InvalidArgument(
            "batch has no supervised token to train on".into(),
        ));
    }
    let xs = tape.select_rows(x, &rows)?;
    let logits = head(tape, xs)?;
    let ce = cross_entropy(tape, logits, &kept, ignore_index)?;
    Ok((ce, rows.len()))
}

/// Masked MSE: `Σ_{rows r with mask[r]} Σ_c (pred − target)² / (count · C)`.
/// `pred, target: [..., C]`; `mask`: one flag per row (e.g. per token of `[B, T]`).
/// Returns `(loss, count)`; no selected row gives loss 0.
pub fn masked_mse_forward<T: AdFloat>(
    pred: &ArrayD<T>,
    target: &ArrayD<T>,
    mask: &[bool],
) -> Result<(T, usize)> {
    let c = pred.shape().last().copied().unwrap_or(0);
    if pred.shape() != target.shape() || pred.ndim() == 0 || c == 0 || pred.len() / c != mask.len()
    {
        return Err(ElmError::shape(
            "masked_mse",
            format!(
                "pred {:?}, target {:?}, mask of {}",
                pred.shape(),
                target.shape(),
                mask.len()
            ),
        ));
    }
    let (p, t) = (standard(pred.clone()), standard(target.clone()));
    let mut total = T::zero();
    let mut count = 0;
    for ((pr, tr), &m) in as_2d(&p).rows().into_iter().zip(as_2d(&t).rows()).zip(mask) {
        if m {
            total += pr
                .iter()
                .zip(tr.iter())
                .map(|(&a, &b)| (a - b) * (a - b))
                .sum::<T>();
            count += 1;
        }
    }
    let loss = if count == 0 {
        T::zero()
    } else {
        total / T::of((count * c) as f64)
    };
    Ok((loss, count))
}

/// `d pred = 2 (pred − target) · dloss / (count · C)` on masked rows (`d target = −d pred`).
pub fn masked_mse_backward<T: AdFloat>(
    pred: &ArrayD<T>,
    target: &ArrayD<T>,
    mask: &[bool],
    count: usize,
    dloss: T,
) -> ArrayD<T> {
    let c = pred.shape().last().copied().unwrap_or(1);
    let mut d = standard(pred - target);
    if count == 0 {
        d.fill(T::zero());
        return d;
    }
    let k = T::of(2.0) * dloss / T::of((count * c) as f64);
    let nd = d.ndim();
    for (mut row, &m) in d.lanes_mut(Axis(nd - 1)).into_iter().zip(mask) {
        if m {
            row.mapv_inplace(|x| x * k);
        } else {
            row.fill(T::zero());
        }
    }
    d
}

/// Tape op for [`masked_mse_forward`]; gradients flow to both `pred` and `target`.
pub fn masked_mse<T: AdFloat>(
    tape: &mut Tape<T>,
    pred: Var,
    target: Var,
    mask: &[bool],
) -> Result<Var> {
    let (ps, ts) = (tape.shared(pred), tape.shared(target));
    let (loss, count) = masked_mse_forward(&ps, &ts, mask)?;
    let mask = mask.to_vec();
    Ok(tape.push_op(
        &[pred, target],
        ArrayD::from_elem(IxDyn(&[]), loss),
        mask.len(),
        move |g, needs| {
            let g0 = *g.iter().next().unwrap();
            let dp = masked_mse_backward(&ps, &ts, &mask, count, g0);
            let dt = needs[1].then(|| dp.mapv(|x| -x));
            Ok(vec![needs[0].then_some(dp), dt])
        },
    ))
}
