//! The benchmarks this binary knows ([`BENCHES`]) and the implementation
//! names `--impls` accepts ([`impl_groups`]).

use crate::config::BenchDef;
use crate::{
    bench_churn, bench_churn_peers, bench_lookup, bench_pools, bench_probe, bench_registration,
    dispatch, impls, pools,
};

/// Every benchmark this binary knows, in the order `--bench all` runs them.
pub const BENCHES: &[BenchDef] = &[
    BenchDef {
        name: "lookup",
        about: "find an address and sum its handlers; all implementations, same data, same run",
        run: bench_lookup::run,
    },
    BenchDef {
        name: "registration",
        about: "ns per address to register N addresses one by one and in bulk",
        run: bench_registration::run,
    },
    BenchDef {
        name: "churn",
        about: "fprobe reader throughput while a writer inserts/removes, as a ratio to an idle writer",
        run: bench_churn::run,
    },
    BenchDef {
        name: "churn-alt",
        about: "the churn writers held and let run every 20 ms inside one phase, windows paired (less drift)",
        run: bench_churn::run_alternating,
    },
    BenchDef {
        name: "churn-rates",
        about: "churn-alt's disjoint and hot-set writers capped at 0.5, 1, 2 and 4 M ops/s and flat out",
        run: bench_churn::run_rates,
    },
    BenchDef {
        name: "churn-peers",
        about: "the flat-out churn writers against papaya, scc, dashmap, RwLock<hashbrown>, arc-swap",
        run: bench_churn_peers::run,
    },
    BenchDef {
        name: "churn-peers-alt",
        about: "churn-peers in paired 20 ms windows, as churn-alt",
        run: bench_churn_peers::run_alternating,
    },
    BenchDef {
        name: "kprobe-multi",
        about: "M calls/s (entry + exit hook) of one probe on one address, fprobe vs locked-HashMap dispatchers",
        run: bench_probe::run_kprobe_multi,
    },
    BenchDef {
        name: "kprobe-multi-all",
        about: "the same with the probe on every address of the set, producers cycling through them",
        run: bench_probe::run_kprobe_multi_all,
    },
    BenchDef {
        name: "kretprobe-multi-all",
        about: "kprobe-multi-all with an exit handler: a return instance reserved and released per call",
        run: bench_probe::run_kretprobe_multi_all,
    },
    BenchDef {
        name: "objpool",
        about: "M pairs/s of pop + push: fprobe::ObjPool vs Treiber freelist, ArrayQueue, Mutex<Vec>, malloc",
        run: bench_pools::run_objpool,
    },
    BenchDef {
        name: "uretprobe-nop",
        about: "M pairs/s of return-instance reserve + release: fprobe::retinst reuse vs a Box per call",
        run: bench_pools::run_uretprobe_nop,
    },
];

/// Implementation names `--impls` accepts, per group of benchmarks.
pub fn impl_groups() -> [(&'static str, Vec<(&'static str, &'static str)>); 4] {
    let pools = pools::KRETPROBE
        .iter()
        .chain(pools::URETPROBE)
        .map(|&(_, n, about)| (n, about))
        .collect();
    [
        ("lookup", impls::NAMES.to_vec()),
        (
            "churn-peers, churn-peers-alt",
            impls::NAMES
                .iter()
                .copied()
                .filter(|(n, _)| bench_churn_peers::NAMES.contains(n))
                .collect(),
        ),
        (
            "kprobe-multi, kprobe-multi-all, kretprobe-multi-all",
            [dispatch::NAMES, bench_probe::NAMES].concat(),
        ),
        ("objpool, uretprobe-nop", pools),
    ]
}
