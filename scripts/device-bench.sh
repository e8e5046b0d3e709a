#!/usr/bin/env bash
# Runs the prebuilt trigger benchmark on a machine without a Rust toolchain.
#
#   scripts/device-bench.sh [DIR]     # DIR holds the `trigger` binary (default device/)
#
# Prepare DIR on a machine with the toolchain (device/ is git-ignored):
#   cargo build --release -p fprobe-bench
#   mkdir -p device && cp "${CARGO_TARGET_DIR:-target}/release/trigger" device/
#
# Two parts, each at 1,2,4,8,16 producers, 300 ms samples (1 warm-up + 4
# kept per cell), every implementation:
#
# lookup: uniform and hot, 50k and 1M addresses, the ten implementations
#   of `lookups` below (every one but the fprobe-small-pages control, which
#   would not fit the time cap; 2-core figures for it are in BENCHMARKS.md,
#   "Huge pages"). Budget: 10 implementations
#   x 5 thread counts x 2 workloads x 1.5 s = 150 s of sampling per size,
#   300 s for both, plus setup (building 10 maps of 1M addresses, streams):
#   about 6 minutes; each run is capped at 230 s.
# probes: kprobe-multi, kprobe-multi-all and kretprobe-multi-all (50k ELF
#   addresses; workloads one and uniform), objpool, uretprobe-nop. Budget:
#   (3 + 3x2 + 3x2 dispatchers + 5 + 2 pools) x 5 thread counts x 1.5 s =
#   165 s plus setup: about 3 minutes, capped at 240 s.
#
# Both parts together take about 9 minutes, near the device's 10-minute
# limit per command: DEVICE_BENCH_PARTS=lookup or =probes runs one part
# (default: lookup,probes), so the parts can go in separate commands.
# DEVICE_BENCH_SMOKE=1 shrinks the samples to 20 ms (a check of the script).
set -u
dir=${1:-device}
bin=$dir/trigger
if [[ ! -x $bin ]]; then
    echo "no executable $bin: build it with 'cargo build --release -p fprobe-bench' and copy ${CARGO_TARGET_DIR:-target}/release/trigger there" >&2
    exit 1
fi
out=$dir/results-$(date +%Y%m%dT%H%M%S)
mkdir -p "$out"
echo "== machine"; nproc; lscpu | grep -E 'Model name|^CPU\(s\)|NUMA node\(s\)|Thread\(s\) per core'; date; uptime
ms=300
[[ ${DEVICE_BENCH_SMOKE:-0} = 1 ]] && ms=20
parts=${DEVICE_BENCH_PARTS:-lookup,probes}
lookups=fprobe,fprobe-lock-per-lookup,hashbrown-ceiling,fixed256,fixed256-array,rwlock-hashbrown,dashmap,papaya,scc,arc-swap
timing=(--threads 1,2,4,8,16 --sample-ms $ms --duration-ms $((ms * 4)) --rounds 1)
rc=0
if [[ ,$parts, = *,lookup,* ]]; then
    for n in 50000 1000000; do
        src=elf
        [[ $n -gt 100000 ]] && src=synthetic   # few ELFs have 1M function symbols
        echo "== lookup, $n addresses ($src)"
        timeout 230 "$bin" --bench lookup --impls "$lookups" "${timing[@]}" --workload uniform,hot \
            --addrs "$n" --addrs-source "$src" \
            --csv "$out/lookup-$n.csv" --svg "$out/lookup-$n.svg" || rc=$?
    done
fi
if [[ ,$parts, = *,probes,* ]]; then
    echo "== kprobe-multi, kprobe-multi-all, kretprobe-multi-all, objpool, uretprobe-nop"
    timeout 240 "$bin" --bench kprobe-multi,kprobe-multi-all,kretprobe-multi-all,objpool,uretprobe-nop \
        "${timing[@]}" --workload one,uniform --addrs 50000 --addrs-source elf \
        --csv "$out/probes.csv" || rc=$?
fi
echo "== results in $out"; ls -l "$out"
exit $rc
