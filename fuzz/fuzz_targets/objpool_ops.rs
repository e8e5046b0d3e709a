//! `cargo fuzz run objpool_ops`: random pop / write / push / drop-pool sequences
//! on `ObjPool`, on this thread and others, checked against a model.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../ops/objpool_ops.rs"]
mod objpool_ops;

fuzz_target!(|data: &[u8]| objpool_ops::run_bytes(data));
