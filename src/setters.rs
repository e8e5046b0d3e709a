//! The builders' setters: each takes a value, stores it in the builder's
//! field of the same name and hands the builder back. Checks happen in
//! `build`, where every setting is known.

/// Expands `$(#[doc] name: Type;)*` inside an `impl` block of a builder to
/// `pub fn name(mut self, name: Type) -> Self`, each storing its argument
/// in the field `name`.
macro_rules! setters {
    ($($(#[$attr:meta])* $name:ident: $ty:ty;)*) => {
        $(
            $(#[$attr])*
            pub fn $name(mut self, $name: $ty) -> Self {
                self.$name = $name;
                self
            }
        )*
    };
}

pub(crate) use setters;
