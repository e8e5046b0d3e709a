//! The repository's own pseudo-random generator, where a fixed sequence
//! needs no `rand` (address sets, lookup streams, the soak tests' choices)
//! or may not use it (`benches/instructions.rs` defines `getrandom` with
//! it): Marsaglia's xorshift64, shifts 13, 7, 17.

/// Advances the state `x` (never 0: it would stay 0) and returns the new
/// state.
#[inline]
pub fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}
