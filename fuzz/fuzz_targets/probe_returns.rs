//! `cargo fuzz run probe_returns`: `probe_ops` with the calls of an engine
//! that takes returns over (`on_entry_taking_return`, `on_return` at
//! fuzzed stack addresses, `longjmp`s and lost returns included) among
//! the others, checked against the same model.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../ops/probe_ops.rs"]
mod probe_ops;

fuzz_target!(|data: &[u8]| probe_ops::run_bytes_taking_returns(data));
