//! Instructions per hot-path operation, for callgrind: one million
//! operations of one kind after the set-up, or none (`none`: the set-up
//! alone, to subtract). `scripts/instructions.sh` runs every mode, divides
//! (mode − none) by 1,000,000 and compares the result with the committed
//! baseline `bench/instructions.baseline`; by hand:
//!
//! ```text
//! bin=$(scripts/bench-executable.sh instructions)   # cargo bench --bench instructions --no-run
//! for m in none rcu lookup-hit lookup-miss kprobe kretprobe hitcache-hit objpool; do
//!   env -i PATH=/usr/bin:/bin valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     "$bin" $m 2>&1 | grep refs
//! done
//! ```
//!
//! Run by `cargo bench` (which passes `--bench` and nothing else) it
//! measures nothing, since the counts need callgrind: it says how to get
//! them and exits.
//!
//! Modes (one operation each):
//!
//! * `rcu`: `rcu::read_lock()` and the guard's drop.
//! * `lookup-hit`: `AddrIndex::get` with its read-side section, on a hot
//!   set of 64 of 50,000 indexed addresses, values read.
//! * `lookup-miss`: the same on 64 addresses that are not in the index.
//! * `kprobe`: `Registry::on_entry` + `on_exit`, one probe with an entry
//!   handler only on all 50,000 addresses, calls on the hot set of 64.
//! * `kretprobe`: the same with entry and exit handlers and 8 bytes of
//!   per-call data.
//! * `hitcache-hit`: `AddrIndex::get` through a hit cache that is always
//!   on (`HitCacheConfig::adaptive(false)`), warmed on the hot set, so
//!   every lookup is a cache hit.
//! * `objpool`: `ObjPool` pop + push through the thread's magazine.
//! * `depot`, `malloc` (comparisons, not in the baseline): the pool with
//!   magazines off (the shared depot alone), and a `Box` of the same 64
//!   bytes allocated and freed.
//! * `kretprobe-256`, `retinst`, `retinst-256` (comparisons of the ways to
//!   keep per-call data from entry to exit, not in the baseline):
//!   `kretprobe` with 256 bytes of per-call data; and a
//!   [`ReturnStack`](fprobe::retinst::ReturnStack) push + pop with 8 or 256
//!   bytes of data, without a lookup or a handler (what an engine with its
//!   own dispatch adds per call). Each writes and reads the data's first 8
//!   bytes, as `kretprobe` does, so the data size changes only what the
//!   mechanism does.
//!
//! A second argument `uniform` spreads the lookups and calls of the
//! `lookup-*`, `kprobe` and `kretprobe` modes over all 50,000 addresses
//! (`none` must get it too, since it changes the set-up).
//!
//! Every mode builds every structure and warms each once on the hot set,
//! so the set-up is the same for all and cancels out.
//!
//! **Deterministic.** Instruction counts do not depend on what else the
//! machine runs, so they compare builds where timings are too noisy; the
//! driver also removes what would make them differ between runs. The bare
//! indexes get a fixed hash seed. A registry's index draws its seed from
//! std's random hash keys and the address of a stack variable (the
//! registry builder takes no seed), and where the 64 hot addresses land
//! moves a dispatch by one or two instructions, so this binary defines
//! `getrandom` (std's source of those keys) to return a fixed stream, and
//! runs everything on a spawned thread, whose stack address does not
//! depend on the length of the arguments and environment as the main
//! thread's does. The script also runs it in a fixed environment (its
//! size changes what the C library's start-up executes). Two runs then
//! agree to within a few instructions in all (std's start-up parses
//! `/proc/self/maps`), far below the 0.1 per operation printed.

#[path = "common/valgrind_args.rs"]
mod valgrind_args;
#[path = "common/xorshift.rs"]
mod xorshift;

use std::hint::black_box;

use fprobe::probe::{EntryAction, Fprobe, Registry};
use fprobe::retinst::{ProbeRef, RetInstPool, ReturnStack};
use fprobe::{AddrIndex, HitCache, HitCacheConfig, ObjPool};

/// Addresses in the indexes and registries.
const ADDRS: u64 = 50_000;
/// Operations per measured mode.
const OPS: usize = 1_000_000;
/// Addresses the hot stream cycles through.
const HOT: usize = 64;
/// Fixed hash seed of the bare indexes, so that their layout is the same
/// on every run.
const SEED: u64 = 7;

/// The mode names (`scripts/instructions.sh` and the baseline use them).
const MODES: &[&str] = &[
    "none",
    "rcu",
    "lookup-hit",
    "lookup-miss",
    "kprobe",
    "kretprobe",
    "kprobe-hitcache",
    "hitcache-hit",
    "hitcache-inline",
    "objpool",
    "depot",
    "malloc",
    "kretprobe-256",
    "retinst",
    "retinst-256",
];

type Obj = [u64; 8];

/// Everything any mode measures, built before any of them runs.
struct Setup {
    /// Indexed addresses, in the stream's order.
    hits: Vec<u64>,
    /// Addresses in no index, the same distance from the indexed ones.
    misses: Vec<u64>,
    index: AddrIndex<u64>,
    cached: AddrIndex<u64>,
    /// A standalone cache in front of `index`, holding the value itself.
    inline: HitCache<u64>,
    kprobe: Registry<u64>,
    kretprobe: Registry<u64>,
    /// `kretprobe` with 256 bytes of per-call data.
    kretprobe_256: Registry<u64>,
    /// This thread's return stacks of pools with 8 and 256 bytes of data
    /// per instance.
    retinst: ReturnStack,
    retinst_256: ReturnStack,
    /// `kprobe` with a hit cache always on in front of its index.
    kprobe_cached: Registry<u64>,
    pool: ObjPool<Obj>,
    depot: ObjPool<Obj>,
    /// The hit cache's misses after the warm-up.
    cache_misses: u64,
}

fn main() {
    let args = valgrind_args::args("instructions", "scripts/instructions.sh");
    let mode = args.first().cloned().unwrap_or_else(|| "kprobe".into());
    // A second argument `uniform` spreads the stream over every address.
    let uniform = args.get(1).map(String::as_str) == Some("uniform");
    if !MODES.contains(&mode.as_str()) {
        eprintln!(
            "usage: instructions {} [uniform] (got {mode:?})",
            MODES.join("|")
        );
        std::process::exit(2);
    }
    // On a thread of its own: see "Deterministic" above.
    std::thread::spawn(move || run(&mode, uniform))
        .join()
        .expect("the measured thread panicked");
}

fn run(mode: &str, uniform: bool) {
    let mut s = setup(uniform);
    match mode {
        "none" => {}
        "rcu" => rcu(),
        "lookup-hit" => lookups(&s.index, &s.hits),
        "lookup-miss" => lookups(&s.index, &s.misses),
        "hitcache-hit" => lookups(&s.cached, &s.hits),
        "hitcache-inline" => inline_lookups(&s.inline, &s.index, &s.hits),
        "kprobe" => dispatches(&s.kprobe, &s.hits),
        "kretprobe" => dispatches(&s.kretprobe, &s.hits),
        "kprobe-hitcache" => dispatches(&s.kprobe_cached, &s.hits),
        "objpool" => pops(&s.pool),
        "depot" => pops(&s.depot),
        "malloc" => mallocs(),
        "kretprobe-256" => dispatches(&s.kretprobe_256, &s.hits),
        "retinst" => return_instances(&mut s.retinst, 8, &s.hits),
        "retinst-256" => return_instances(&mut s.retinst_256, 256, &s.hits),
        _ => unreachable!("main checked the mode"),
    }
    // Read in every mode, so that the check costs `none` the same.
    let misses = cache_misses(&s.cached);
    let inline_misses = s.inline.stats().misses;
    if mode == "hitcache-hit" && !uniform {
        assert_eq!(misses, s.cache_misses, "a hot lookup missed the hit cache");
    }
    if mode == "hitcache-inline" && !uniform {
        assert_eq!(
            inline_misses, HOT as u64,
            "a hot lookup missed the hit cache"
        );
    }
    drop(black_box(s));
}

fn setup(uniform: bool) -> Setup {
    let addrs: Vec<u64> = (0..ADDRS).map(|i| 0x40_0000 + i * 48).collect();
    let spread = if uniform { addrs.len() } else { HOT };
    let hits: Vec<u64> = (0..OPS)
        .map(|i| addrs[(i * 7919 + i * i * 31) % spread])
        .collect();
    // 16 bytes past an indexed address: between two of them, in none.
    let misses: Vec<u64> = hits.iter().map(|a| a + 16).collect();

    let index = AddrIndex::<u64>::builder()
        .capacity(addrs.len())
        .hash_seed(SEED)
        .build()
        .expect("valid configuration");
    index
        .insert_many(addrs.iter().map(|&a| (a, a)))
        .expect("room");
    let cached = AddrIndex::<u64>::builder()
        .capacity(addrs.len())
        .hash_seed(SEED)
        .hit_cache(HitCacheConfig::new().adaptive(false))
        .build()
        .expect("valid configuration");
    cached
        .insert_many(addrs.iter().map(|&a| (a, a)))
        .expect("room");

    // One probe with an entry handler on every address, without and with a
    // hit cache kept on in front of the registry's index.
    let kprobe_registry = |cache: Option<HitCacheConfig>| {
        let b = Registry::<u64>::builder().capacity(addrs.len());
        let b = match cache {
            Some(c) => b.hit_cache(c),
            None => b,
        };
        let reg = b.build().expect("valid configuration");
        let entry_only = Fprobe::<u64>::builder()
            .entry(|e| {
                black_box(e.addr);
                EntryAction::Continue
            })
            .build();
        reg.register(entry_only, &addrs).expect("room");
        reg
    };
    let kprobe = kprobe_registry(None);
    let kprobe_cached = kprobe_registry(Some(HitCacheConfig::new().adaptive(false)));

    // One probe with entry and exit handlers and 8 bytes of per-call data
    // on every address, and the same with 256 bytes; the handlers write
    // and read the first 8.
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
    let kretprobe_256 = Registry::<u64>::builder()
        .capacity(addrs.len())
        .data_size(256)
        .build()
        .expect("valid configuration");
    let with_exit_256 = Fprobe::<u64>::builder()
        .data_size(256)
        .entry(|e| {
            e.data[..8].copy_from_slice(&e.addr.to_ne_bytes());
            EntryAction::Continue
        })
        .exit(|x| {
            black_box(&x.data[..8]);
        })
        .build();
    kretprobe_256.register(with_exit_256, &addrs).expect("room");
    let return_stack = |data: usize| {
        RetInstPool::builder()
            .data_size(data)
            .build()
            .expect("valid configuration")
            .register_thread()
    };
    let mut retinst = return_stack(8);
    let mut retinst_256 = return_stack(256);

    let pool = ObjPool::new(1024, |_| Obj::default());
    let depot = ObjPool::builder()
        .thread_cache(0)
        .build(1024, |_| Obj::default())
        .expect("valid configuration");

    // First use outside the measured loops: the thread's state in each
    // registry, the hit cache's entries for the hot set (every measured
    // lookup through it is then a hit), the pools' magazines.
    let warm = &addrs[..HOT];
    let warm_misses: Vec<u64> = warm.iter().map(|a| a + 16).collect();
    lookups(&index, warm);
    lookups(&index, &warm_misses);
    lookups(&cached, warm);
    let inline = HitCache::new(HitCacheConfig::new().adaptive(false)).expect("valid configuration");
    inline_lookups(&inline, &index, warm);
    dispatches(&kprobe, warm);
    dispatches(&kretprobe, warm);
    dispatches(&kretprobe_256, warm);
    return_instances(&mut retinst, 8, warm);
    return_instances(&mut retinst_256, 256, warm);
    dispatches(&kprobe_cached, warm);
    let cache_misses = cache_misses(&cached);
    pops_n(&pool, 1);
    pops_n(&depot, 1);

    Setup {
        hits,
        misses,
        index,
        cached,
        inline,
        kprobe,
        kretprobe,
        kretprobe_256,
        retinst,
        retinst_256,
        kprobe_cached,
        pool,
        depot,
        cache_misses,
    }
}

fn cache_misses(index: &AddrIndex<u64>) -> u64 {
    index
        .hit_cache_stats()
        .expect("built with a hit cache")
        .misses
}

#[inline(never)]
fn rcu() {
    for _ in 0..OPS {
        drop(black_box(fprobe::rcu::read_lock()));
    }
}

#[inline(never)]
fn lookups(index: &AddrIndex<u64>, stream: &[u64]) {
    for &a in stream {
        let guard = fprobe::rcu::read_lock();
        for v in index.get(a, &guard) {
            black_box(v);
        }
    }
}

/// Lookups through a standalone cache whose answer is the address's
/// (first) value: a hit needs no read-side section.
#[inline(never)]
fn inline_lookups(cache: &HitCache<u64>, index: &AddrIndex<u64>, stream: &[u64]) {
    for &a in stream {
        black_box(cache.lookup(a, || index.lookup(a, |v| v[0]).unwrap_or(0)));
    }
}

#[inline(never)]
fn dispatches(reg: &Registry<u64>, stream: &[u64]) {
    for &a in stream {
        reg.on_entry(a, 0, &0);
        reg.on_exit(0, &0);
    }
}

/// Entry + return through this thread's return stack `stack`, `data`
/// bytes each, the first 8 written at entry and read at return.
#[inline(never)]
fn return_instances(stack: &mut ReturnStack, data: usize, stream: &[u64]) {
    let probe = ProbeRef {
        slot: 1,
        generation: 1,
    };
    for &a in stream {
        let d = stack.push(probe, a, data).expect("room");
        d[..8].copy_from_slice(&a.to_ne_bytes());
        let ri = stack.pop().expect("pushed");
        black_box(&ri.data()[..8]);
    }
}

fn pops(pool: &ObjPool<Obj>) {
    pops_n(pool, OPS);
}

#[inline(never)]
fn pops_n(pool: &ObjPool<Obj>, n: usize) {
    for i in 0..n {
        let mut o = pool.pop().expect("free objects");
        o[0] = i as u64;
        drop(black_box(o));
    }
}

#[inline(never)]
fn mallocs() {
    for i in 0..OPS {
        let mut o = Box::new(Obj::default());
        o[0] = i as u64;
        drop(black_box(o));
    }
}

/// std's source of random hash keys (a weak reference to glibc's
/// `getrandom(2)` wrapper, which this definition replaces in this binary):
/// a fixed stream instead, so that every run builds the same hash tables.
/// Nothing else in this program asks for randomness.
///
/// # Safety
///
/// `buf` must be valid for writes of `len` bytes, as `getrandom(2)`
/// requires of its callers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getrandom(buf: *mut u8, len: usize, _flags: u32) -> isize {
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    for i in 0..len {
        let x = xorshift::next(&mut state);
        // SAFETY: `i < len`, and the caller passes a buffer of `len`
        // writable bytes (the function's contract).
        unsafe { buf.add(i).write(x as u8) };
    }
    len as isize
}
