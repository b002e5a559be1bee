//! Command-line values that name a variant of one of the library's enumerated extension points
//! (`--task`, `--method`): parsed by the library's `FromStr` (its error, as clap's default parser
//! for a `FromStr` type reports it) and listed in `--help` from the library's one list
//! ([`elm::registry::Registry`]), so the binary keeps no copy of the names.

use std::ffi::OsStr;
use std::marker::PhantomData;

use clap::builder::{PossibleValue, StringValueParser, TypedValueParser};
use elm::registry::Registry;

/// The parser of a [`Registry`] value: `#[arg(long, value_parser = registry::named::<Task>())]`.
pub struct Named<T>(PhantomData<fn() -> T>);

impl<T> Clone for Named<T> {
    fn clone(&self) -> Self {
        Named(PhantomData)
    }
}

/// See [`Named`].
pub fn named<T>() -> Named<T> {
    Named(PhantomData)
}

impl<T> TypedValueParser for Named<T>
where
    T: Registry + std::str::FromStr + Clone + Send + Sync + 'static,
    T::Err: std::error::Error + Send + Sync + 'static,
{
    type Value = T;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<T, clap::Error> {
        StringValueParser::new()
            .try_map(|s| s.parse::<T>())
            .parse_ref(cmd, arg, value)
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        Some(Box::new(
            T::all().iter().map(|v| PossibleValue::new(v.name())),
        ))
    }
}
