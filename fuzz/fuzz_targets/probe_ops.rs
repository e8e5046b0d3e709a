//! `cargo fuzz run probe_ops`: random register / unregister / enable /
//! disable / entry / exit sequences on `probe::Registry`, checked against a
//! model of which handlers must run and what the counters must read.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../ops/probe_ops.rs"]
mod probe_ops;

fuzz_target!(|data: &[u8]| probe_ops::run_bytes(data));
