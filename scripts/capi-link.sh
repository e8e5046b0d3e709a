#!/usr/bin/env bash
# Links the C test program (capi/ctest/c) against the crate's shipped C
# artifacts with the system C compiler, shared and static, and runs both:
# the header, the exported ABI and the -finstrument-functions hooks work
# for a C toolchain, not only through cargo.
set -eu
cd "$(dirname "$0")/.."
cargo build --release -p fprobe-capi
lib=target/release
out=target/capi-link
mkdir -p "$out"
cc=${CC:-cc}
flags=(-O2 -std=c11 -Wall -Wextra -Werror -pthread -Icapi/include -Icapi/ctest/c)
"$cc" "${flags[@]}" -finstrument-functions -c capi/ctest/c/calls.c -o "$out/calls.o"
"$cc" "${flags[@]}" -c capi/ctest/c/main.c -o "$out/main.o"
# Shared: libfprobe_capi.so resolves the hooks and the ABI at load time.
"$cc" -o "$out/ctest-shared" "$out/main.o" "$out/calls.o" -L"$lib" -lfprobe_capi -pthread -ldl
echo "== shared (libfprobe_capi.so)"
LD_LIBRARY_PATH="$lib" "$out/ctest-shared"
# Static: libfprobe_capi.a, plus the system libraries Rust's std needs.
"$cc" -o "$out/ctest-static" "$out/main.o" "$out/calls.o" "$lib/libfprobe_capi.a" -pthread -ldl -lm
echo "== static (libfprobe_capi.a)"
"$out/ctest-static"
