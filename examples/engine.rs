//! An example engine loop: a toy "program" whose functions call each other,
//! instrumented the way a trampoline-based engine would: `on_entry` when a
//! function is entered, `on_exit` when it returns. Two probes:
//!
//! * `calls`: counts calls per function (entry handler, cookie = function
//!   index);
//! * `latency`: records the entry time in the per-call data and adds the
//!   inclusive time at exit.
//!
//! Several threads run the program while a control thread attaches,
//! disables and detaches probes. Run: `cargo run --release --example engine`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use fprobe::probe::{EntryAction, Fprobe, Registry};

/// The engine's per-call context: here just the thread's clock origin.
struct Ctx {
    origin: Instant,
}

const FUNCS: [(&str, u64); 4] = [
    ("main_loop", 0x40_1000),
    ("parse", 0x40_1100),
    ("hash", 0x40_1200),
    ("emit", 0x40_1300),
];

/// The instrumented program: every function reports entry and exit.
fn call(reg: &Registry<Ctx>, ctx: &Ctx, f: usize, depth: u32) -> u64 {
    reg.on_entry(FUNCS[f].1, 0, ctx);
    let mut acc = f as u64;
    if depth > 0 {
        for g in 1..FUNCS.len() {
            if (g + depth as usize) % 2 == 0 {
                acc = acc.wrapping_add(call(reg, ctx, g, depth - 1));
            }
        }
    }
    for i in 0..200u64 {
        acc = acc.wrapping_mul(31).wrapping_add(i); // the function's "work"
    }
    reg.on_exit(0, ctx);
    acc
}

fn main() {
    let reg = Arc::new(Registry::<Ctx>::builder().data_size(8).build().unwrap());
    let calls: Arc<Vec<AtomicU64>> = Arc::new(FUNCS.iter().map(|_| AtomicU64::new(0)).collect());
    let nanos: Arc<Vec<AtomicU64>> = Arc::new(FUNCS.iter().map(|_| AtomicU64::new(0)).collect());

    let c = calls.clone();
    let count = Fprobe::builder()
        .entry(move |e| {
            // Handlers run on the program's threads: keep them short. (A real
            // engine would keep per-thread counters; this is an example.)
            c[e.cookie as usize].fetch_add(1, Ordering::Relaxed);
            EntryAction::Continue
        })
        .build();
    let count = reg
        .register_with_cookies(
            count,
            FUNCS.iter().enumerate().map(|(i, f)| (f.1, i as u64)),
        )
        .unwrap();

    let n = nanos.clone();
    let latency = Fprobe::builder()
        .data_size(8)
        .entry(|e: &mut fprobe::probe::EntryContext<'_, Ctx>| {
            let t = e.ctx.origin.elapsed().as_nanos() as u64;
            e.data.copy_from_slice(&t.to_ne_bytes());
            EntryAction::Continue
        })
        .exit(move |x| {
            let t0 = u64::from_ne_bytes(x.data.try_into().unwrap());
            let t1 = x.ctx.origin.elapsed().as_nanos() as u64;
            n[x.cookie as usize].fetch_add(t1 - t0, Ordering::Relaxed);
        })
        .build();
    let latency = reg
        .register_with_cookies(
            latency,
            FUNCS.iter().enumerate().map(|(i, f)| (f.1, i as u64)),
        )
        .unwrap();

    let workers: Vec<_> = (0..2)
        .map(|_| {
            let reg = reg.clone();
            std::thread::spawn(move || {
                let ctx = Ctx {
                    origin: Instant::now(),
                };
                let mut acc = 0u64;
                for _ in 0..20_000 {
                    acc = acc.wrapping_add(call(&reg, &ctx, 0, 3));
                }
                acc
            })
        })
        .collect();

    // Control thread: toggle and finally detach the latency probe while the
    // program runs; unregister never waits for calls in flight.
    std::thread::sleep(std::time::Duration::from_millis(20));
    reg.disable(latency).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    reg.enable(latency).unwrap();
    let lat_stats = reg.stats(latency).unwrap();
    reg.unregister(latency).unwrap();
    for w in workers {
        std::hint::black_box(w.join().unwrap());
    }
    let count_stats = reg.stats(count).unwrap();

    println!("{:<10} {:>10} {:>16}", "function", "calls", "inclusive ms");
    for (i, (name, _)) in FUNCS.iter().enumerate() {
        println!(
            "{name:<10} {:>10} {:>16.2}",
            calls[i].load(Ordering::Relaxed),
            nanos[i].load(Ordering::Relaxed) as f64 / 1e6
        );
    }
    println!("calls probe:   {count_stats:?}");
    println!("latency probe (before unregister): {lat_stats:?}");
    reg.unregister(count).unwrap();
}
