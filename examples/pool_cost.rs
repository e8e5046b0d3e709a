//! Instructions per object-pool pop + push pair, for callgrind: one million
//! pairs on one thread through `fprobe::ObjPool` (the thread's magazine),
//! through the pool with magazines off (the shared depot alone), through a
//! `Box` allocated and freed per pair (glibc's malloc), or nothing (the
//! set-up alone, to subtract).
//!
//! ```text
//! cargo build --release --example pool_cost
//! for m in none objpool depot malloc; do
//!   valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     target/release/examples/pool_cost $m 2>&1 | grep refs
//! done
//! ```
//!
//! (mode − none) / 1,000,000 is the cost of one pair. Instruction counts do
//! not depend on what else the machine runs.

use std::hint::black_box;

use fprobe::ObjPool;

const PAIRS: usize = 1_000_000;

type Obj = [u64; 8];

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "objpool".into());
    let pool = ObjPool::new(1024, |_| Obj::default());
    let depot = ObjPool::builder()
        .thread_cache(0)
        .build(1024, |_| Obj::default())
        .expect("valid configuration");
    // First use outside the measured loop (the magazine's allocation).
    drop(pool.pop());
    drop(depot.pop());
    match mode.as_str() {
        "none" => {}
        "objpool" => {
            for i in 0..PAIRS {
                let mut o = pool.pop().expect("free objects");
                o[0] = i as u64;
                drop(black_box(o));
            }
        }
        "depot" => {
            for i in 0..PAIRS {
                let mut o = depot.pop().expect("free objects");
                o[0] = i as u64;
                drop(black_box(o));
            }
        }
        "malloc" => {
            for i in 0..PAIRS {
                let mut o = Box::new(Obj::default());
                o[0] = i as u64;
                drop(black_box(o));
            }
        }
        other => panic!("unknown mode {other:?}: none, objpool, depot or malloc"),
    }
}
