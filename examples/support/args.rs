//! The examples' one command-line helper (they keep to `std::env::args`; the `elm` binary uses
//! clap). Included with `#[path]` by examples/gemm_bench.rs, train_profile.rs and
//! deq_classifier.rs.

use elm::error::ElmError;

/// The value after `name` in `args` parsed as `T`, `default` when `name` is absent, and a typed
/// error naming the flag when its value is missing or does not parse.
pub fn flag<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> elm::Result<T> {
    match args.iter().position(|a| a == name) {
        None => Ok(default),
        Some(i) => args.get(i + 1).and_then(|v| v.parse().ok()).ok_or_else(|| {
            let ty = std::any::type_name::<T>()
                .rsplit("::")
                .next()
                .unwrap_or("value");
            ElmError::config(name, format!("expects a value of type {ty}"))
        }),
    }
}
