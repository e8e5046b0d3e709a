//! Instructions per dispatch, for callgrind: one million entry + exit
//! pairs on a hot set of 64 of 50,000 probed addresses (or, with a second
//! argument `uniform`, spread over all of them), or the bare index lookup
//! on the same addresses, or nothing (the set-up alone, to subtract).
//!
//! ```text
//! cargo build --release --example dispatch_cost
//! for m in none lookup kprobe kretprobe; do
//!   valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     target/release/examples/dispatch_cost $m 2>&1 | grep refs
//! done
//! ```
//!
//! (mode − none) / 1,000,000 is the cost of one pair (or one lookup with
//! its read-side section). Instruction counts do not depend on what else
//! the machine runs, so they compare builds where timings are too noisy.

use std::hint::black_box;

use fprobe::AddrIndex;
use fprobe::probe::{EntryAction, Fprobe, Registry};

const ADDRS: u64 = 50_000;
const PAIRS: usize = 1_000_000;

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "kprobe".into());
    // A second argument `uniform` spreads the calls over every address.
    let uniform = std::env::args().nth(2).as_deref() == Some("uniform");
    let addrs: Vec<u64> = (0..ADDRS).map(|i| 0x40_0000 + i * 48).collect();
    let spread = if uniform { addrs.len() } else { 64 };
    let stream: Vec<u64> = (0..PAIRS)
        .map(|i| addrs[(i * 7919 + i * i * 31) % spread])
        .collect();

    let kprobe = Registry::<u64>::builder()
        .capacity(addrs.len())
        .build()
        .expect("valid configuration");
    let entry_only = Fprobe::<u64>::builder()
        .entry(|e| {
            black_box(e.addr);
            EntryAction::Continue
        })
        .build();
    kprobe.register(entry_only, &addrs).expect("room");

    let kretprobe = Registry::<u64>::builder()
        .capacity(addrs.len())
        .build()
        .expect("valid configuration");
    let with_exit = Fprobe::<u64>::builder()
        .data_size(8)
        .entry(|e| {
            e.data.copy_from_slice(&e.addr.to_ne_bytes());
            EntryAction::Continue
        })
        .exit(|x| {
            black_box(x.data);
        })
        .build();
    kretprobe.register(with_exit, &addrs).expect("room");

    let index = AddrIndex::<u64>::builder()
        .capacity(addrs.len())
        .build()
        .expect("valid configuration");
    for &a in &addrs {
        index.insert(a, a).expect("room");
    }

    let reg = match mode.as_str() {
        "none" => return,
        "lookup" => {
            for &a in &stream {
                let guard = fprobe::rcu::read_lock();
                for v in index.get(a, &guard) {
                    black_box(v);
                }
            }
            return;
        }
        "kprobe" => &kprobe,
        "kretprobe" => &kretprobe,
        other => {
            eprintln!(
                "usage: dispatch_cost none|lookup|kprobe|kretprobe [uniform] (got {other:?})"
            );
            std::process::exit(2);
        }
    };
    for &a in &stream {
        reg.on_entry(a, 0, &0);
        reg.on_exit(0, &0);
    }
}
