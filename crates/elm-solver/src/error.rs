//! [`SolverError`], the crate's one error type, and the memory and iteration limits every solve
//! checks before it allocates or loops.

/// A map's own error, boxed so that any [`crate::FixedPointMap`] can return its own type (a model's
/// maps return the model's error enum) and get it back unchanged from the solve
/// ([`SolverError::Map`], then `downcast`).
pub type MapError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a solve, a config or a canonical problem was refused. Each variant names the field or
/// operation at fault.
#[derive(Debug, thiserror::Error)]
pub enum SolverError {
    /// A config value out of range (`field` as in the JSON form, e.g. `stop.max_iter`).
    #[error("config `{field}`: {msg}")]
    Config { field: String, msg: String },
    /// Arrays of the wrong shape.
    #[error("shape mismatch in {op}: {msg}")]
    Shape { op: String, msg: String },
    /// A request that cannot be served (e.g. a problem of size 0).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// An allocation the memory budget cannot hold.
    #[error("`{field}`: needs {needed} bytes, only {available} bytes available")]
    Budget {
        field: String,
        needed: u128,
        available: u128,
    },
    /// A JSON config that does not parse (unknown keys included).
    #[error("json {what}: {msg}")]
    Json { what: String, msg: String },
    /// The map's own error, returned unchanged inside.
    #[error("{0}")]
    Map(MapError),
}

impl From<MapError> for SolverError {
    fn from(e: MapError) -> Self {
        SolverError::Map(e)
    }
}

impl SolverError {
    /// A [`SolverError::Config`] naming `field`.
    pub fn config(field: impl Into<String>, msg: impl Into<String>) -> Self {
        SolverError::Config {
            field: field.into(),
            msg: msg.into(),
        }
    }
    /// A [`SolverError::Shape`] naming the operation.
    pub fn shape(op: impl Into<String>, msg: impl Into<String>) -> Self {
        SolverError::Shape {
            op: op.into(),
            msg: msg.into(),
        }
    }
}

/// The crate's result type.
pub type Result<T, E = SolverError> = std::result::Result<T, E>;

/// Largest `max_iter` any solve accepts: a bound a script cannot hit by accident
/// (`max_iter = usize::MAX` with no tolerance would otherwise never stop).
pub const MAX_ITER_CAP: usize = 1_000_000;

/// Environment variable capping the memory budget in bytes (below what the machine has).
pub const MEM_BUDGET_ENV: &str = "ELM_MEM_BUDGET";

/// Bytes of `factors` elements of `elem` bytes each, saturating at `u128::MAX` (for budgets:
/// a saturated figure is still refused).
pub fn bytes_of(elem: usize, factors: &[usize]) -> u128 {
    factors
        .iter()
        .fold(elem as u128, |acc, &f| acc.saturating_mul(f as u128))
}

/// MemAvailable from /proc/meminfo, in bytes (`None` where unknown).
pub fn mem_available() -> Option<u128> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u128 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The bytes one allocation may take: MemAvailable, lowered by `$ELM_MEM_BUDGET` when set.
/// Unknown on both counts: unlimited (the allocator is then the last word).
pub fn mem_budget() -> Option<u128> {
    let cap = std::env::var(MEM_BUDGET_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u128>().ok());
    match (mem_available(), cap) {
        (Some(a), Some(c)) => Some(a.min(c)),
        (a, c) => a.or(c),
    }
}

/// Refuses an allocation of `bytes` driven by `field` that exceeds [`mem_budget`].
pub fn check_alloc(field: &str, bytes: u128) -> Result<()> {
    match mem_budget() {
        Some(available) if bytes > available => Err(SolverError::Budget {
            field: field.to_string(),
            needed: bytes,
            available,
        }),
        _ => Ok(()),
    }
}

/// Refuses `max_iter` of 0 or above [`MAX_ITER_CAP`].
pub fn check_max_iter(field: &str, max_iter: usize) -> Result<()> {
    if max_iter == 0 {
        return Err(SolverError::config(field, "must be >= 1"));
    }
    if max_iter > MAX_ITER_CAP {
        return Err(SolverError::config(
            field,
            format!("{max_iter} exceeds the cap of {MAX_ITER_CAP} iterations"),
        ));
    }
    Ok(())
}
