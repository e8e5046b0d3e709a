//! Deterministic per-lookup costs for `scripts/cachegrind-lookup.sh`:
//! builds a 50,000-address index (fixed hash seed) and an unsynchronised
//! `hashbrown::HashMap` on the same addresses, then runs one lookup stream
//! (uniform, or hot: 90% of lookups on 64 addresses) through one of them.
//! Under cachegrind the script runs each configuration twice, with and
//! without the lookups, and divides the difference by the lookup count, so
//! building the maps and the streams cancels out.
//!
//! `fprobe-switched` and `fprobe-cached` are the index with its hit cache
//! (default configuration, and always on); the first prints on stderr
//! whether its switch ended on or off.
//!
//! `"$(scripts/bench-executable.sh lookup_counts)" fprobe|fprobe-switched|fprobe-cached|hashbrown hot|uniform LOOKUPS [skip]`
//! (the script passes the lookup count it divides by), or
//! `cargo bench --bench lookup_counts -- IMPLEMENTATION WORKLOAD LOOKUPS [skip]`.
//! Run by `cargo bench` alone (which passes `--bench` and nothing else) it
//! measures nothing, since the counts need cachegrind: it says how to get
//! them and exits.

#[path = "common/valgrind_args.rs"]
mod valgrind_args;
#[path = "common/xorshift.rs"]
mod xorshift;

use std::hint::black_box;

use fprobe::{AddrIndex, HitCacheConfig, rcu};

fn main() {
    let args = valgrind_args::args("lookup_counts", "scripts/cachegrind-lookup.sh");
    let (imp, work, lookups) = match (args.first(), args.get(1), args.get(2).map(|n| n.parse())) {
        (Some(i), Some(w), Some(Ok(n))) => (i.as_str(), w.as_str(), n),
        _ => {
            eprintln!(
                "usage: lookup_counts fprobe|fprobe-switched|fprobe-cached|hashbrown hot|uniform LOOKUPS [skip]"
            );
            std::process::exit(2);
        }
    };
    let skip = args.get(3).is_some_and(|s| s == "skip");
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || xorshift::next(&mut x);
    // Function-like addresses: 16-byte aligned, in one 4 GiB text range.
    let keys: Vec<u64> = (0..50_000)
        .map(|_| 0x5555_0000_0000 + (next() % (1 << 28)) * 16)
        .collect();
    let hot = &keys[..64];
    let stream: Vec<u64> = (0..lookups)
        .map(|_| {
            if work == "hot" && next() % 10 != 0 {
                hot[(next() % 64) as usize]
            } else {
                keys[(next() % keys.len() as u64) as usize]
            }
        })
        .collect();
    let sum = match imp {
        "fprobe" | "fprobe-switched" | "fprobe-cached" => {
            let builder = AddrIndex::<u64>::builder().hash_seed(7);
            let builder = match imp {
                "fprobe-switched" => builder.hit_cache(HitCacheConfig::new()),
                "fprobe-cached" => builder.hit_cache(HitCacheConfig::new().adaptive(false)),
                _ => builder,
            };
            let index = builder.build().expect("valid");
            index
                .insert_many(keys.iter().map(|&k| (k, k)))
                .expect("no limit");
            let sum = fprobe_lookups(&index, if skip { &[] } else { &stream });
            if let (Some(s), "fprobe-switched") = (index.hit_cache_stats(), imp) {
                eprintln!(
                    "switch: {}, trials {}",
                    if s.enabled { "on" } else { "off" },
                    s.trials
                );
            }
            sum
        }
        "hashbrown" => {
            let mut map: hashbrown::HashMap<u64, Vec<u64>> = hashbrown::HashMap::new();
            for &k in &keys {
                map.entry(k).or_default().push(k);
            }
            hashbrown_lookups(&map, if skip { &[] } else { &stream })
        }
        other => panic!("unknown implementation {other}"),
    };
    black_box(sum);
}

#[inline(never)]
fn fprobe_lookups(index: &AddrIndex<u64>, stream: &[u64]) -> u64 {
    let guard = rcu::read_lock();
    stream
        .iter()
        .map(|&a| index.get(a, &guard).iter().sum::<u64>())
        .fold(0, u64::wrapping_add)
}

#[inline(never)]
fn hashbrown_lookups(map: &hashbrown::HashMap<u64, Vec<u64>>, stream: &[u64]) -> u64 {
    stream
        .iter()
        .map(|a| map.get(a).map_or(0, |v| v.iter().sum::<u64>()))
        .fold(0, u64::wrapping_add)
}
