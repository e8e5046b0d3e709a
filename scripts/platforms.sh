#!/usr/bin/env bash
# Every platform the crate supports besides the host (README, "Platforms"):
#
#  1. `cargo check` and `cargo clippy -- -D warnings` of fprobe and
#     fprobe-capi for aarch64 Linux, x86-64 and arm64 macOS, x86-64 Windows
#     (GNU) and x86-64 FreeBSD (installing each target with rustup when it
#     is missing);
#  2. fprobe's unit and integration tests built for aarch64 Linux and run
#     under qemu-user (cross linker, C library and qemu installed with
#     apt-get when missing), then the RCU and index tests again in the
#     symmetric-fence mode (FPROBE_RCU_NO_MEMBARRIER), the one macOS and
#     FreeBSD get.
#
# A part whose tools cannot be installed prints a line with SKIPPED and
# the reason and counts as passed; a build, lint or test failure fails the
# script. Under qemu-user the tests that fork or spawn the test binary are
# left out (FPROBE_TEST_QEMU_USER: each says why; qemu-user's child of a
# multi-threaded process crashes when it creates a thread), as are the
# doctests (the host's `cargo test` runs them). About 5 minutes on 2 cores
# with the tools installed.
set -uo pipefail
cd "$(dirname "$0")/.."

status=0
t_start=$SECONDS
note() { echo "platforms: $*"; }

# Root, or passwordless sudo, for apt-get; empty when neither.
if [ "$(id -u)" = 0 ]; then
  sudo=""
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  sudo="sudo -n"
else
  sudo="none"
fi

apt_install() { # apt_install PACKAGE...: quietly; false when it could not
  [ "$sudo" != none ] && command -v apt-get >/dev/null || return 1
  if [ -z "${apt_updated:-}" ]; then
    timeout 300 $sudo apt-get update -qq >/tmp/platforms-apt.log 2>&1 || return 1
    apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive timeout 600 $sudo apt-get install -y -qq --no-install-recommends "$@" \
    >>/tmp/platforms-apt.log 2>&1
}

add_target() { # add_target TRIPLE: installed already, or by rustup
  rustup target list --installed 2>/dev/null | grep -qx "$1" && return 0
  command -v rustup >/dev/null || return 1
  timeout 300 rustup target add "$1" >/tmp/platforms-rustup.log 2>&1
}

# 1. Check and lint for every non-host target.
for t in aarch64-unknown-linux-gnu x86_64-apple-darwin aarch64-apple-darwin x86_64-pc-windows-gnu x86_64-unknown-freebsd; do
  if ! add_target "$t"; then
    note "$t: SKIPPED (rustup could not install the target: $(tail -1 /tmp/platforms-rustup.log 2>/dev/null))"
    continue
  fi
  t0=$SECONDS
  if cargo check -q -p fprobe --target "$t" &&
    cargo check -q -p fprobe-capi --target "$t" &&
    cargo clippy -q -p fprobe -p fprobe-capi --target "$t" -- -D warnings; then
    note "$t: check + clippy passed ($((SECONDS - t0)) s)"
  else
    note "$t: check + clippy FAILED"
    status=1
  fi
done

# 2. aarch64 Linux under qemu-user.
qemu_tests() {
  local qemu sysroot=/usr/aarch64-linux-gnu
  qemu=$(command -v qemu-aarch64 || command -v qemu-aarch64-static)
  if [ -z "$qemu" ] || ! command -v aarch64-linux-gnu-gcc >/dev/null || [ ! -e "$sysroot/lib/libc.so.6" ]; then
    note "installing qemu-user, gcc-aarch64-linux-gnu and libc6-dev-arm64-cross with apt-get"
    apt_install qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross ||
      apt_install qemu-user-static gcc-aarch64-linux-gnu libc6-dev-arm64-cross
    qemu=$(command -v qemu-aarch64 || command -v qemu-aarch64-static)
  fi
  if [ -z "$qemu" ] || ! command -v aarch64-linux-gnu-gcc >/dev/null || [ ! -e "$sysroot/lib/libc.so.6" ]; then
    note "aarch64 tests under qemu-user: SKIPPED (qemu-user or the aarch64 cross toolchain is not available and apt-get could not install it)"
    return 0
  fi
  if ! add_target aarch64-unknown-linux-gnu; then
    note "aarch64 tests under qemu-user: SKIPPED (rustup could not install aarch64-unknown-linux-gnu)"
    return 0
  fi
  export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
  export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="$qemu -L $sysroot"
  export FPROBE_TEST_QEMU_USER=1
  # Signals reach an emulated thread far less often (a few hundred a
  # second): longer storms, so that each still delivers the thousands its
  # test asks for.
  export FPROBE_SIGNAL_SECS=8
  local test=(cargo test -q -p fprobe --target aarch64-unknown-linux-gnu)
  note "aarch64 under $($qemu --version | head -1)"
  note "left out under qemu-user: the fork tests (rcu, probe, hit_cache: the child of a multi-threaded process crashes inside qemu when it creates a thread), bad_input's nesting-overflow row (it spawns the test binary, which the kernel cannot run without binfmt_misc), and the doctests (the host's cargo test runs them)"
  local t0=$SECONDS
  if ! timeout 600 "${test[@]}" --lib --tests --no-run; then
    note "aarch64 test build FAILED"
    return 1
  fi
  note "aarch64 test build: $((SECONDS - t0)) s"
  t0=$SECONDS
  if ! timeout 480 "${test[@]}" --lib --tests; then
    note "aarch64 tests under qemu-user FAILED (or ran past 480 s)"
    return 1
  fi
  note "aarch64 unit + integration tests under qemu-user passed ($((SECONDS - t0)) s)"
  t0=$SECONDS
  if ! FPROBE_RCU_NO_MEMBARRIER=1 timeout 300 "${test[@]}" --test rcu --test index; then
    note "aarch64 rcu + index tests with symmetric fences FAILED (or ran past 300 s)"
    return 1
  fi
  note "aarch64 rcu + index tests with symmetric fences passed ($((SECONDS - t0)) s)"
}
qemu_tests || status=1

note "done in $((SECONDS - t_start)) s"
exit $status
