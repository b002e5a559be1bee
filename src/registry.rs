//! Enumerated extension points (evaluation tasks, pruning methods, gradient rules, CUDA kernels,
//! window selectors): each keeps ONE list of its variants, the enum's declaration inside a
//! [`variant_list!`] call, from which its `ALL`, names and `Display` follow. Every match over such an enum is exhaustive (no `_ =>` arm), so
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

/// The one list of an enum's variants is the enum's declaration itself, written inside
/// `variant_list!`:
///
/// ```ignore
/// crate::registry::variant_list! {
///     #[derive(Clone, Copy, Debug, PartialEq, Eq)]
///     pub enum PruneMethod("method") {
///         /// ShortGPT: ...
///         ShortGpt,
///         ...
///     }
/// }
/// ```
///
/// declares the enum as written and, from the same variant list, `PruneMethod::ALL` (an array
/// in declaration order), [`Registry`] (with the enum's own `name(self) -> &'static str`, an
/// exhaustive match) and `Display`. A new variant is in `ALL` by construction; every match over
/// the enum is exhaustive, so the compiler then asks for each arm.
macro_rules! variant_list {
    (
        $(#[$meta:meta])*
        $vis:vis enum $ty:ident($what:literal) {
            $($(#[$variant_meta:meta])* $variant:ident),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis enum $ty {
            $($(#[$variant_meta])* $variant),+
        }
        impl $ty {
            /// Every variant, in declaration order: the one list (`crate::registry::variant_list!`).
            pub const ALL: [$ty; [$(stringify!($variant)),+].len()] = [$($ty::$variant),+];
        }
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
