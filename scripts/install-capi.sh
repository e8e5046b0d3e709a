#!/usr/bin/env bash
# Builds the C library (crate fprobe-capi) in release and installs it the
# way C projects expect:
#
#   PREFIX/lib/libfprobe.so.X.Y.Z        the shared library, soname libfprobe.so.ABI
#   PREFIX/lib/libfprobe.so.ABI -> libfprobe.so.X.Y.Z   (what programs load)
#   PREFIX/lib/libfprobe.so     -> libfprobe.so.ABI     (what -lfprobe links)
#   PREFIX/lib/libfprobe.a               the static library
#   PREFIX/include/fprobe.h              the header (capi/include/fprobe.h)
#   PREFIX/lib/pkgconfig/fprobe.pc       pkg-config name `fprobe`
#
# Usage: scripts/install-capi.sh [PREFIX]   (default /usr/local; PREFIX must
# be absolute; Linux). DESTDIR is honoured: files go to $DESTDIR$PREFIX, and
# fprobe.pc names PREFIX. Needs cargo and the C toolchain Rust links with;
# installing under /usr/local takes root, and `ldconfig` afterwards.
#
# Soname policy: the soname's number is the ABI version, and it changes on
# every ABI break (a function removed or its signature changed, a struct's
# layout or a constant's value changed). It follows Cargo's compatibility
# rule for the crate's version: for 0.x.y the ABI version is 0.x (0.1.y
# installs libfprobe.so.0.1.y with soname libfprobe.so.0.1, and 0.2.0 is
# the next ABI); from 1.0.0 on it is the major version (libfprobe.so.1).
# So a release that breaks the ABI bumps the minor version while below 1.0
# and the major version after.
#
# The crate's own library is libfprobe_capi (lib name fprobe_capi: the rest
# of the workspace links it under that name, and `fprobe` is the Rust
# crate's), so this script renames on install. A plain `cargo build` gives
# it no soname; this one does (capi/build.rs, FPROBE_CAPI_SONAME), in a
# target directory of its own (default $CARGO_TARGET_DIR/capi-install or
# target/capi-install; FPROBE_CAPI_TARGET_DIR overrides) so that the two
# builds never rebuild each other's files.
#
# Why not cargo-c (`cargo cinstall`), which does all of this: it is built
# on the cargo library of one Rust release, so each version needs a recent
# rustc (the newest, 0.10.26, needs 1.97; 0.10.24 is the newest for the
# 1.95 toolchain here, and `cargo install cargo-c@0.10.24 --locked` took
# 16.5 minutes on this 2-core machine under load), CI starts from a fresh
# machine each run, and it would also want a `capi` feature in the crate.
# This script needs only cargo, coreutils and the C toolchain; besides
# the release build (25-45 s from scratch here) it copies files.
set -euo pipefail

root=$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)
cd "$root"

if [ $# -gt 1 ] || [[ ${1-} == -* ]]; then
  echo "usage: $0 [PREFIX]    (default /usr/local; DESTDIR honoured)" >&2
  exit 2
fi
prefix=${1:-/usr/local}
[ "$prefix" = / ] || prefix=${prefix%/}
case $prefix in
  /*) ;;
  *) echo "install-capi: PREFIX must be an absolute path, got '$prefix'" >&2; exit 2 ;;
esac
destdir=${DESTDIR-}
libdir=$prefix/lib
includedir=$prefix/include

cargo=${CARGO:-cargo}
version=$("$cargo" pkgid -p fprobe-capi | sed 's/.*[#@]//')
if ! [[ $version =~ ^([0-9]+)\.([0-9]+)\.([0-9]+)$ ]]; then
  echo "install-capi: fprobe-capi's version '$version' is not MAJOR.MINOR.PATCH" >&2
  exit 1
fi
major=${BASH_REMATCH[1]} minor=${BASH_REMATCH[2]}
# The policy above: 0.x -> 0.x, otherwise the major version.
if [ "$major" = 0 ]; then abi=0.$minor; else abi=$major; fi
real=libfprobe.so.$version
soname=libfprobe.so.$abi

target=${FPROBE_CAPI_TARGET_DIR:-${CARGO_TARGET_DIR:-$root/target}/capi-install}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
echo "install-capi: building fprobe-capi $version (soname $soname) in $target"
# One rustc run makes the rlib, the cdylib and the staticlib, and prints the
# system libraries the staticlib needs (cargo replays the note when the
# build is fresh).
FPROBE_CAPI_SONAME=$soname CARGO_TARGET_DIR=$target \
  "$cargo" rustc --release -p fprobe-capi --lib -- --print native-static-libs 2>&1 | tee "$log"
native=$(sed -n 's/^note: native-static-libs: //p' "$log" | tail -n 1)
if [ -z "$native" ]; then
  echo "install-capi: rustc printed no native-static-libs line" >&2
  exit 1
fi
built=$target/release
if command -v readelf >/dev/null; then
  got=$(readelf -d "$built/libfprobe_capi.so" | sed -n 's/.*Library soname: \[\(.*\)\].*/\1/p')
  if [ "$got" != "$soname" ]; then
    echo "install-capi: $built/libfprobe_capi.so has soname '$got', want '$soname'" >&2
    exit 1
  fi
fi

pc=$(mktemp)
trap 'rm -f "$log" "$pc"' EXIT
cat > "$pc" <<EOF
prefix=$prefix
exec_prefix=\${prefix}
libdir=\${exec_prefix}/lib
includedir=\${prefix}/include

Name: fprobe
Description: Userspace fprobe: probes with entry and exit handlers on function addresses, RCU-protected dispatch
Version: $version
Libs: -L\${libdir} -lfprobe
Libs.private: $native
Cflags: -I\${includedir}
EOF

d=$destdir
install -d "$d$libdir" "$d$libdir/pkgconfig" "$d$includedir"
install -m 0755 "$built/libfprobe_capi.so" "$d$libdir/$real"
ln -sfn "$real" "$d$libdir/$soname"
ln -sfn "$soname" "$d$libdir/libfprobe.so"
install -m 0644 "$built/libfprobe_capi.a" "$d$libdir/libfprobe.a"
install -m 0644 capi/include/fprobe.h "$d$includedir/fprobe.h"
install -m 0644 "$pc" "$d$libdir/pkgconfig/fprobe.pc"

echo "install-capi: installed fprobe $version under $d$prefix:"
for f in "$libdir/$real" "$libdir/$soname" "$libdir/libfprobe.so" "$libdir/libfprobe.a" \
  "$includedir/fprobe.h" "$libdir/pkgconfig/fprobe.pc"; do
  echo "  $d$f"
done
echo "install-capi: build with: cc prog.c \$(pkg-config --cflags --libs fprobe)" \
  "(PKG_CONFIG_PATH=$libdir/pkgconfig if pkg-config does not look there);"
echo "install-capi: at run time the loader finds $soname after \`ldconfig\` when $libdir" \
  "is in its search path, or with LD_LIBRARY_PATH=$libdir"
