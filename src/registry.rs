//! Enumerated extension points (evaluation tasks, pruning methods, gradient rules, CUDA kernels):
//! each keeps ONE list of its variants, written once in a [`variant_list!`] call, and the
//! compiler checks that list against the enum, so a variant added to the enum and forgotten in
//! the list does not compile. Every match over such an enum is exhaustive (no `_ =>` arm), so
//! a new variant also fails to compile until each match says what it does.
//!
//! [`Registry`] is the generic view of such a list (its variants and their names) that the
//! command line, `paper_repro` and the round-trip tests read instead of keeping a copy.

/// An enum whose variants are listed once ([`variant_list!`]), each with a name (its command
/// line and JSON spelling).
pub trait Registry: Sized + Copy + PartialEq + std::fmt::Debug + 'static {
    /// What a value names, for error messages (`method`, `task`, ...).
    const WHAT: &'static str;
    /// Every variant, in declaration order (the enum's `ALL`).
    fn all() -> &'static [Self];
    /// The variant's name.
    fn name(self) -> &'static str;
    /// Every variant's name, in [`Registry::all`]'s order.
    fn names() -> Vec<&'static str> {
        Self::all().iter().map(|v| v.name()).collect()
    }
    /// The variant named `name`.
    fn from_name(name: &str) -> Option<Self> {
        Self::all().iter().copied().find(|v| v.name() == name)
    }
}

/// `a, b, c or d`: the names of `T`'s variants, for error messages.
pub fn names_or<T: Registry>() -> String {
    match T::names().split_last() {
        Some((last, [])) => last.to_string(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// The one list of an enum's variants: `variant_list!(PruneMethod, "method", [ShortGpt, ...])`
/// defines `PruneMethod::ALL` (an array, declaration order) from the list and implements
/// [`Registry`] with the enum's own `name(self) -> &'static str`. From the same list it
/// generates an exhaustive match over the enum (no wildcard arm): a variant missing from the
/// list is a compile error (`non-exhaustive patterns`), a variant listed twice one too
/// (`unreachable pattern`, denied).
macro_rules! variant_list {
    ($ty:ident, $what:literal, [$($variant:ident),+ $(,)?]) => {
        impl $ty {
            /// Every variant, in declaration order: the one list (`crate::registry::variant_list!`),
            /// checked by the compiler against the enum.
            pub const ALL: [$ty; [$(stringify!($variant)),+].len()] = [$($ty::$variant),+];
        }
        const _: () = {
            // The list is checked here: this match is exhaustive only if it names every variant.
            #[deny(unreachable_patterns)]
            #[allow(dead_code)]
            const fn every_variant_is_listed(v: $ty) {
                match v {
                    $($ty::$variant => {})+
                }
            }
        };
        impl $crate::registry::Registry for $ty {
            const WHAT: &'static str = $what;
            fn all() -> &'static [Self] {
                &$ty::ALL
            }
            fn name(self) -> &'static str {
                $ty::name(self)
            }
        }
        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str($ty::name(*self))
            }
        }
    };
}
pub(crate) use variant_list;
