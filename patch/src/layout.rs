//! How a patchable function's nops are laid out.

/// How a function's patchable nops are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Five nops before the function and two at it
    /// (`-fpatchable-function-entry=7,5`): what the runtime patches.
    HotPatch,
    /// Another split of one-byte nops, `before` the function and `at` it.
    Other {
        /// Nops before the function's address.
        before: u8,
        /// Nops at the function's address.
        at: u8,
    },
    /// No function symbol was found near the site (a stripped object).
    Unknown,
}
