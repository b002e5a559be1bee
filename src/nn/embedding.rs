//! Token-embedding gather.

use ndarray::{ArrayD, Axis, Ix2, IxDyn};

use crate::autograd::{AdFloat, Tape, Var};
use crate::error::{ElmError, Result};

/// `table: [V, C]`, `ids` (row-major over `lead`, e.g. `[B, T]`) → `[lead..., C]`.
pub fn forward<T: AdFloat>(table: &ArrayD<T>, ids: &[usize], lead: &[usize]) -> Result<ArrayD<T>> {
    let t2 = table.view().into_dimensionality::<Ix2>().map_err(|_| {
        ElmError::shape(
            "embedding",
            format!("table must be [V, C], got {:?}", table.shape()),
        )
    })?;
    if lead.iter().product::<usize>() != ids.len() {
        return Err(ElmError::shape(
            "embedding",
            format!("{} ids do not fill shape {lead:?}", ids.len()),
        ));
    }
    if let Some(&bad) = ids.iter().find(|&&i| i >= t2.nrows()) {
        return Err(ElmError::InvalidArgument(format!(
            "token id {bad} out of range for vocabulary of {}",
            t2.nrows()
        )));
    }
    let rows = t2.select(Axis(0), ids);
    let mut shape = lead.to_vec();
    shape.push(t2.ncols());
    Ok(rows
        .into_dyn()
        .into_shape_with_order(IxDyn(&shape))
        .unwrap())
}

/// Scatter-add of `dy: [lead..., C]` into a `[V, C]` table gradient.
pub fn backward<T: AdFloat>(vocab: usize, ids: &[usize], dy: &ArrayD<T>) -> ArrayD<T> {
    let c = dy.shape().last().copied().unwrap_or(0);
    let dy = crate::autograd::ops::standard(dy.clone());
    let dy2 = crate::autograd::ops::as_2d(&dy);
    let mut dt = ndarray::Array2::<T>::zeros((vocab, c));
    for (row, &id) in dy2.rows().into_iter().zip(ids) {
        let mut dst = dt.row_mut(id);
        dst += &row;
    }
    dt.into_dyn()
}

/// Tape op for [`forward`]; gradient flows to `table` only (ids are data).
pub fn embedding<T: AdFloat>(
    tape: &mut Tape<T>,
    table: Var,
    ids: &[usize],
    lead: &[usize],
) -> Result<Var> {
    let tv = tape.value(table);
    let y = forward(tv, ids, lead)?;
    let vocab = tv.shape()[0];
    let ids = ids.to_vec();
    let bytes = ids.len() * std::mem::size_of::<usize>();
    Ok(tape.push_op(&[table], y, bytes, move |dy, _| {
        Ok(vec![Some(backward(vocab, &ids, dy))])
    }))
}
