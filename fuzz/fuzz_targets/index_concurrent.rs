//! `cargo fuzz run index_concurrent`: random operation sequences on `AddrIndex`,
//! dealt to 2-3 threads that run them at once; each thread checks its own
//! view, and the final contents and drop counts are checked at the end.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../ops/index_concurrent.rs"]
mod index_concurrent;

fuzz_target!(|data: &[u8]| index_concurrent::run_bytes(data));
