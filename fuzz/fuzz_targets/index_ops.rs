//! `cargo fuzz run index_ops`: random operation sequences on `AddrIndex`,
//! each step checked against a `HashMap` model.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../ops/index_ops.rs"]
mod index_ops;

fuzz_target!(|data: &[u8]| index_ops::run_bytes(data));
