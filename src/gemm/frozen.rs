//! The frozen-pack registry: weights registered as unchanging ([`FrozenWeights`]) and the
//! packed forms ([`Panels`]) built from them, so a product whose `B` lies inside one of them
//! packs it once and reuses it. The registry is keyed by address range, so any view of a
//! registered weight (e.g. its transpose) finds it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, OnceLock};

use ndarray::ArrayView2;

use super::settings::{precision, Precision};

/// One packed form of one view: where it starts, its shape and strides, the format.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    ptr: usize,
    dim: (usize, usize),
    strides: (isize, isize),
    bf16: bool,
}

pub(super) type Slot = Arc<OnceLock<Panels>>;

#[derive(Default)]
struct Registry {
    next_owner: u64,
    /// `[start, end)` byte ranges of registered weights and their owner.
    ranges: Vec<(usize, usize, u64)>,
    packs: HashMap<Key, (u64, Slot)>,
}

static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(Default::default);
/// Registered ranges, read without the lock: products skip the lookup while there are none.
static RANGES: AtomicUsize = AtomicUsize::new(0);

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    // A panic elsewhere while holding the lock leaves the registry consistent (every
    // change is one push or retain).
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

pub(super) fn new_owner() -> u64 {
    let mut r = registry();
    r.next_owner += 1;
    r.next_owner
}

pub(super) fn register(owner: u64, start: usize, bytes: usize) {
    if bytes == 0 {
        return;
    }
    registry().ranges.push((start, start + bytes, owner));
    RANGES.fetch_add(1, Ordering::Relaxed);
}

pub(super) fn release(owner: u64) {
    let mut r = registry();
    let before = r.ranges.len();
    r.ranges.retain(|&(_, _, o)| o != owner);
    RANGES.fetch_sub(before - r.ranges.len(), Ordering::Relaxed);
    r.packs.retain(|_, (o, _)| *o != owner);
}

/// Bytes of the packed forms built so far, of one owner or (`None`) of all.
pub(super) fn packed_bytes(owner: Option<u64>) -> u64 {
    registry()
        .packs
        .values()
        .filter(|(o, _)| owner.is_none_or(|w| w == *o))
        .filter_map(|(_, slot)| slot.get().map(Panels::bytes))
        .sum()
}

pub(super) fn registered_bytes(owner: u64) -> u64 {
    registry()
        .ranges
        .iter()
        .filter(|(_, _, o)| *o == owner)
        .map(|&(s, e, _)| (e - s) as u64)
        .sum()
}

/// The packed form of `b` if `b` lies wholly inside a registered weight (made empty here,
/// filled by the caller through `OnceLock::get_or_init`, so concurrent products build it once).
pub(super) fn lookup(bf16: bool, b: &ArrayView2<f32>) -> Option<Slot> {
    if RANGES.load(Ordering::Relaxed) == 0 {
        return None;
    }
    let (rows, cols) = b.dim();
    let (rs, cs) = (b.strides()[0], b.strides()[1]);
    if rows == 0 || cols == 0 || rs < 0 || cs < 0 {
        return None;
    }
    let start = b.as_ptr() as usize;
    let last = (rows - 1) * rs as usize + (cols - 1) * cs as usize;
    let end = start + (last + 1) * std::mem::size_of::<f32>();
    let mut r = registry();
    let owner = r
        .ranges
        .iter()
        .find(|&&(s, e, _)| s <= start && end <= e)
        .map(|&(_, _, o)| o)?;
    let key = Key {
        ptr: start,
        dim: (rows, cols),
        strides: (rs, cs),
        bf16,
    };
    Some(
        r.packs
            .entry(key)
            .or_insert_with(|| (owner, Slot::default()))
            .1
            .clone(),
    )
}

/// A `B` packed whole: per `KC`-block of its rows, every `NR`-column sliver (f32, or bf16
/// k-pairs in one u32).
pub(crate) enum Panels {
    F32(Vec<Vec<f32>>),
    Bf16(Vec<Vec<u32>>),
}

impl Panels {
    fn bytes(&self) -> u64 {
        // Both element types are 4 bytes (a bf16 pair in one u32).
        4 * match self {
            Panels::F32(v) => v.iter().map(Vec::len).sum::<usize>(),
            Panels::Bf16(v) => v.iter().map(Vec::len).sum::<usize>(),
        } as u64
    }
}

/// Weights that stay unchanged while this value lives (borrowed for `'a`, or shared through an
/// `Arc` it keeps a clone of): large products reading one of them as `B` (`x·Wᵀ`, `g·W`) pack
/// it once, in the product's precision, and reuse the packed form until this is dropped,
/// instead of packing it again on every call. The packed forms take memory ([`Self::packed_bytes`]):
/// the weight's size in f32, half of it in bf16, per layout used.
pub struct FrozenWeights<'a> {
    owner: u64,
    shared: Vec<std::sync::Arc<ndarray::ArrayD<f32>>>,
    _borrow: std::marker::PhantomData<&'a f32>,
}

impl Default for FrozenWeights<'_> {
    fn default() -> Self {
        Self::new()
    }
}

impl<'a> FrozenWeights<'a> {
    pub fn new() -> Self {
        FrozenWeights {
            owner: new_owner(),
            shared: Vec::new(),
            _borrow: std::marker::PhantomData,
        }
    }

    fn register_slice(&self, w: Option<&[f32]>) {
        if let Some(w) = w {
            register(self.owner, w.as_ptr() as usize, std::mem::size_of_val(w));
        }
    }

    /// Registers a weight borrowed for this value's life (a non-contiguous one is skipped).
    pub fn borrow<S, D>(&mut self, w: &'a ndarray::ArrayBase<S, D>) -> &mut Self
    where
        S: ndarray::Data<Elem = f32>,
        D: ndarray::Dimension,
    {
        self.register_slice(w.as_slice_memory_order());
        self
    }

    /// Registers a shared weight, keeping it alive (and, being shared, unchanged).
    pub fn share(&mut self, w: &std::sync::Arc<ndarray::ArrayD<f32>>) -> &mut Self {
        self.register_slice(w.as_slice_memory_order());
        self.shared.push(w.clone());
        self
    }

    /// Bytes of the packed forms built so far.
    pub fn packed_bytes(&self) -> u64 {
        packed_bytes(Some(self.owner))
    }

    /// What the packed forms will take once every registered weight has been read in
    /// `layouts` layouts (1: `x·Wᵀ` only, as in inference; 2: `g·W` too, as in training
    /// through a frozen layer) at the current precision: f32 packs are the weight's size,
    /// bf16 ones half of it.
    pub fn expected_packed_bytes(&self, layouts: u64) -> u64 {
        let f32_bytes = registered_bytes(self.owner);
        let per_layout = match precision() {
            Precision::F32 => f32_bytes,
            Precision::Bf16 => f32_bytes / 2,
        };
        per_layout * layouts
    }
}

/// Bytes of every frozen weight's packed forms built so far (all [`FrozenWeights`] alive).
pub fn frozen_packed_bytes() -> u64 {
    packed_bytes(None)
}

impl Drop for FrozenWeights<'_> {
    fn drop(&mut self) {
        release(self.owner);
    }
}
