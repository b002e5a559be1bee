//! [`builtin_kinds!`]: a registry of built-in solvers written as one list.

/// Declares a fieldless enum of built-in kinds from one list of `Variant => "name"` lines, with
/// `ALL` (every variant, in the list's order), `NAMES` (their names, same order), `name()` and
/// `FromStr` (an unknown name is refused with the error `$unknown(name)` returns). Everything is
/// generated from the one list, so no variant can be left out of any of them; what each kind
/// means (its default config, its solve) is written as exhaustive matches where it is used.
macro_rules! builtin_kinds {
    (
        $(#[$meta:meta])*
        pub enum $Kind:ident {
            $($(#[$vmeta:meta])* $Variant:ident => $name:literal,)+
        }
        unknown: $unknown:expr;
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $Kind {
            $($(#[$vmeta])* $Variant,)+
        }

        impl $Kind {
            /// Every variant, in the order of the registry's list.
            pub const ALL: [$Kind; [$($name),+].len()] = [$($Kind::$Variant),+];
            /// Every variant's name, in the order of [`Self::ALL`].
            pub const NAMES: [&'static str; [$($name),+].len()] = [$($name),+];
            /// The name, as in the JSON form's `kind` and on command lines.
            pub const fn name(self) -> &'static str {
                match self {
                    $($Kind::$Variant => $name,)+
                }
            }
        }

        /// A built-in kind by its name (one of [`Self::NAMES`]).
        impl std::str::FromStr for $Kind {
            type Err = crate::error::SolverError;
            fn from_str(name: &str) -> crate::error::Result<Self> {
                $Kind::ALL
                    .into_iter()
                    .find(|k| k.name() == name)
                    .ok_or_else(|| ($unknown)(name))
            }
        }
    };
}

pub(crate) use builtin_kinds;
