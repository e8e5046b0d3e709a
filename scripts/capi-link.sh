#!/usr/bin/env bash
# Links the C test program (capi/ctest/c) against the crate's shipped C
# artifacts with the system C compiler, shared and static, and runs both:
# the header, the exported ABI and the -finstrument-functions hooks work
# for a C toolchain, not only through cargo.
#
# Then installs the C library into a temporary prefix with
# scripts/install-capi.sh and checks the layout (files, symlinks, soname,
# header, fprobe.pc), runs the README's C build lines (the ```sh block
# between <!-- c-quickstart-build --> markers, with the temporary prefix for
# its `prefix=` line) on the README's quick start (the ```c block between
# <!-- c-quickstart --> markers), both taken verbatim from README.md, and
# checks the shared and static programs' output: the README compiles and
# runs as written. pkg-config is installed with apt-get when missing; if it
# cannot be, that part prints SKIPPED with the reason.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p fprobe-capi
target=${CARGO_TARGET_DIR:-target}
lib=$target/release
out=$target/capi-link
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

echo "== installed library and the README's C quick start"
if ! command -v pkg-config >/dev/null; then
  echo "pkg-config is missing: installing it with apt-get"
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    { timeout 180 apt-get update -qq &&
      DEBIAN_FRONTEND=noninteractive timeout 180 apt-get install -y -qq --no-install-recommends pkg-config; } ||
      echo "apt-get could not install pkg-config"
  fi
fi
if ! command -v pkg-config >/dev/null; then
  echo "SKIPPED (pkg-config not available, apt-get could not install it): the installed library and the README's C quick start are unchecked"
  exit 0
fi

fail() { echo "FAIL: $*" >&2; exit 1; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/capi-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
work=$tmp/work
mkdir -p "$work"

# extract MARKER: the fenced block between <!-- MARKER --> and <!-- /MARKER -->.
extract() {
  local open="<!-- $1 -->" close="<!-- /$1 -->"
  [ "$(grep -cxF "$open" README.md)" = 1 ] && [ "$(grep -cxF "$close" README.md)" = 1 ] ||
    fail "README.md needs exactly one '$open' and one '$close'"
  awk -v from="$open" -v to="$close" '
    $0 == from { inside = 1; next }
    $0 == to { inside = 0; next }
    inside && /^```/ { fences++; next }
    inside && fences == 1 { print }
    END { if (fences != 2) exit 1 }
  ' README.md || fail "README.md: no single fenced block between '$open' and '$close'"
}
extract c-quickstart > "$work/quickstart.c"
extract c-quickstart-build > "$tmp/build.sh"
[ "$(grep -c '^prefix=' "$tmp/build.sh")" = 1 ] ||
  fail "README.md's c-quickstart-build block needs one 'prefix=' line"

# The README's lines, run from a directory holding quickstart.c and (as in
# the repository) scripts/, with the temporary prefix and no inherited
# search paths.
ln -s "$PWD/scripts" "$work/scripts"
{
  echo 'set -euxo pipefail'
  printf 'prefix=%q\n' "$prefix"
  grep -v '^prefix=' "$tmp/build.sh"
} > "$tmp/run.sh"
echo "-- README's build lines, prefix=$prefix:"
sed 's/^/   /' "$tmp/build.sh"
(cd "$work" && env -u PKG_CONFIG_PATH -u LD_LIBRARY_PATH bash "$tmp/run.sh") ||
  fail "the README's C build lines failed"

# What the README's program prints.
expected=$(
  cat <<'EOF'
square(1) = 1
cube(1) = 1
square(2) = 4
cube(2) = 8
square(3) = 9
cube(3) = 27
sum 50; probe: 6 hits, 6 exits, 0 missed
EOF
)

export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
# The layout install-capi.sh promises, and the soname policy (0.x.y: ABI
# 0.x; from 1.0: the major version) checked independently of it.
version=$(pkg-config --modversion fprobe)
[ "$version" = "$(cargo pkgid -p fprobe-capi | sed 's/.*[#@]//')" ] ||
  fail "fprobe.pc Version $version is not fprobe-capi's"
IFS=. read -r major minor _ <<<"$version"
if [ "$major" = 0 ]; then soname=libfprobe.so.0.$minor; else soname=libfprobe.so.$major; fi
l=$prefix/lib
[ -f "$l/libfprobe.so.$version" ] && [ ! -L "$l/libfprobe.so.$version" ] || fail "no $l/libfprobe.so.$version"
[ "$(readlink "$l/$soname")" = "libfprobe.so.$version" ] || fail "$l/$soname is not a link to libfprobe.so.$version"
[ "$(readlink "$l/libfprobe.so")" = "$soname" ] || fail "$l/libfprobe.so is not a link to $soname"
[ -f "$l/libfprobe.a" ] || fail "no $l/libfprobe.a"
cmp -s capi/include/fprobe.h "$prefix/include/fprobe.h" || fail "installed fprobe.h differs from capi/include/fprobe.h"
got=$(readelf -d "$l/libfprobe.so.$version" | sed -n 's/.*Library soname: \[\(.*\)\].*/\1/p')
[ "$got" = "$soname" ] || fail "soname '$got', want '$soname'"
# pkgconf and freedesktop pkg-config differ in trailing blanks only.
pc() { pkg-config "$@" fprobe | xargs; }
[ "$(pc --libs)" = "-L$l -lfprobe" ] || fail "pkg-config --libs: $(pc --libs)"
[ "$(pc --cflags)" = "-I$prefix/include" ] || fail "pkg-config --cflags: $(pc --cflags)"
[[ " $(pc --static --libs) " == *" -lpthread "* ]] || fail "pkg-config --static --libs: $(pc --static --libs)"
echo "-- installed (soname $soname):"
(cd "$prefix" && ls -l lib/libfprobe* include/fprobe.h lib/pkgconfig/fprobe.pc | sed 's/^/   /')

# The two programs the README's lines built, run again and checked.
cd "$work"
needed=$(readelf -d quickstart | grep NEEDED)
grep -qF "Shared library: [$soname]" <<<"$needed" || fail "quickstart does not need $soname: $needed"
! grep -qF "libfprobe_capi" <<<"$needed" || fail "quickstart needs libfprobe_capi: $needed"
loads=$(LD_LIBRARY_PATH=$l ldd ./quickstart)
grep -qF "$soname => $l/$soname" <<<"$loads" || fail "quickstart does not load $l/$soname: $loads"
got=$(LD_LIBRARY_PATH=$l ./quickstart) || fail "quickstart exited non-zero"
[ "$got" = "$expected" ] || fail "quickstart printed:"$'\n'"$got"$'\n'"want:"$'\n'"$expected"
echo "-- shared (installed $soname, via LD_LIBRARY_PATH): output as expected"
needed=$(readelf -d quickstart-static | grep NEEDED)
! grep -qF "[libfprobe" <<<"$needed" || fail "quickstart-static needs a libfprobe shared library: $needed"
got=$(./quickstart-static) || fail "quickstart-static exited non-zero"
[ "$got" = "$expected" ] || fail "quickstart-static printed:"$'\n'"$got"$'\n'"want:"$'\n'"$expected"
echo "-- static (installed libfprobe.a, pkg-config --static): output as expected"
# As written and also under strict warnings, in each C standard.
for std in c99 c11 c17; do
  "$cc" -std=$std -Wall -Wextra -Werror -pedantic $(pkg-config --cflags fprobe) -c quickstart.c -o /dev/null ||
    fail "quickstart.c does not compile with -std=$std -Wall -Wextra -Werror -pedantic"
done
echo "-- quickstart.c: no warning under -Wall -Wextra -pedantic (c99, c11, c17)"
cd - >/dev/null

# DESTDIR: files under DESTDIR, fprobe.pc naming PREFIX.
DESTDIR=$tmp/dest scripts/install-capi.sh /opt/fprobe >/dev/null
for f in lib/libfprobe.so.$version lib/$soname lib/libfprobe.so lib/libfprobe.a include/fprobe.h lib/pkgconfig/fprobe.pc; do
  [ -e "$tmp/dest/opt/fprobe/$f" ] || fail "DESTDIR install: no $tmp/dest/opt/fprobe/$f"
done
grep -qx 'prefix=/opt/fprobe' "$tmp/dest/opt/fprobe/lib/pkgconfig/fprobe.pc" || fail "DESTDIR install: fprobe.pc does not name prefix /opt/fprobe"
echo "-- DESTDIR install: files under DESTDIR, fprobe.pc with prefix=/opt/fprobe"
echo "capi-link: ok"
