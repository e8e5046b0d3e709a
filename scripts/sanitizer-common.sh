# Sourced by scripts/tsan.sh and scripts/asan.sh: installs nightly and
# rust-src (for -Zbuild-std) if missing, or prints SKIPPED and exits 0.
# Sets `san_target` and `san_dir` (target directory per sanitizer).
san_need_nightly() { # san_need_nightly NAME
  local name=$1
  if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "$name: installing nightly"
    if ! rustup toolchain install nightly --profile minimal >"/tmp/$name-install.log" 2>&1; then
      echo "$name: SKIPPED (nightly install failed: $(tail -1 "/tmp/$name-install.log"))"
      exit 0
    fi
  fi
  if ! rustup component list --toolchain nightly --installed 2>/dev/null | grep -q '^rust-src'; then
    echo "$name: installing rust-src (for -Zbuild-std)"
    if ! rustup component add --toolchain nightly rust-src >>"/tmp/$name-install.log" 2>&1; then
      echo "$name: SKIPPED (rust-src install failed: $(tail -1 "/tmp/$name-install.log"))"
      exit 0
    fi
  fi
  san_target=x86_64-unknown-linux-gnu
  san_dir="${CARGO_TARGET_DIR:-target}/$name"
  mkdir -p "$san_dir"
}

# san_setup NAME RUSTFLAGS PROPTEST_CASES: san_need_nightly NAME, then
# builds with RUSTFLAGS (docs too) into $san_dir; short stress runs
# (FPROBE_STRESS_MS 1000) and PROPTEST_CASES cases unless the caller set
# them.
san_setup() {
  san_need_nightly "$1"
  export RUSTFLAGS="$2"
  export RUSTDOCFLAGS="$RUSTFLAGS"
  export CARGO_TARGET_DIR="$san_dir"
  export FPROBE_STRESS_MS="${FPROBE_STRESS_MS:-1000}" PROPTEST_CASES="${PROPTEST_CASES:-$3}"
}

# san_cargo ARGS...: `cargo test` with the sanitizer's std, for $san_target.
san_cargo() { cargo +nightly test -Zbuild-std --target "$san_target" "$@"; }

# san_canary NAME PATTERN CMD...: runs CMD (a checker run of a deliberately
# broken test); passes only if it fails AND its output matches PATTERN.
san_canary() {
  local name=$1 pattern=$2 log
  shift 2
  log="$san_dir/canary.log"
  mkdir -p "$san_dir"
  echo "== $name: canary (must be caught)"
  if "$@" >"$log" 2>&1; then
    echo "$name canary: NOT CAUGHT (the checker is blind)"; return 1
  elif grep -q "$pattern" "$log"; then
    echo "$name canary: canary caught"; grep -m2 "$pattern" "$log"; return 0
  else
    echo "$name canary: failed for another reason:"; tail -30 "$log"; return 1
  fi
}

# san_build NAME CMD...: builds the instrumented tests with CMD (output in
# $san_dir.build.log). A compile error fails the script; any other failure
# (the sanitizer toolchain unavailable) prints SKIPPED and the reason and
# exits 0. Returns only when the build succeeded.
san_build() {
  local name=$1
  shift
  if ! "$@" >"$san_dir.build.log" 2>&1; then
    if grep -q "error\[E\|error: could not compile" "$san_dir.build.log"; then
      echo "$name: build FAILED"; tail -30 "$san_dir.build.log"; exit 1
    fi
    echo "$name: SKIPPED (sanitizer build unavailable: $(grep -m1 -i error "$san_dir.build.log" | cut -c1-120))"
    exit 0
  fi
}
