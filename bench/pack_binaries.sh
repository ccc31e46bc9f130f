#!/usr/bin/env bash
# Packs built programs for a machine that has none of this one's libraries but the C and C++
# runtimes: each program stripped under bin/ (or under the folder named by a "DIR:" prefix, e.g.
# base:old/bin/ds4-bench), and every shared library any of them loads that is not the C library,
# libm, libstdc++, libgcc_s or the loader, under lib/ (point LIB there: the round scripts put it
# on LD_LIBRARY_PATH). Writes an xz tarball, small enough to travel with the working tree.
# SKIP_LIBS lists libraries the target machine has already (names, e.g. "libcrypto.so.3
# libgomp.so.1 libfmt.so.9", which the CUDA machines' Ubuntu 24.04 image had on 2026-12-06):
# left out, they leave room for another program (llama-bench) under the carry limit.
#   SKIP_LIBS="..." bench/pack_binaries.sh OUT.tar.xz [DIR:]PROGRAM...
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 OUT.tar.xz [DIR:]PROGRAM..." >&2; exit 2; }
out=$1
shift
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/lib"
for spec in "$@"; do
  dir=bin prog=$spec
  if [[ $spec == *:* ]]; then dir=${spec%%:*} prog=${spec#*:}; fi
  [ -x "$prog" ] || { echo "$0: $prog is not an executable" >&2; exit 2; }
  mkdir -p "$stage/$dir"
  strip -o "$stage/$dir/$(basename "$prog")" "$prog"
  # "libfoo.so.1 => /path/libfoo.so.1 (0x...)"; a library not found fails the pack.
  if ldd "$prog" | grep -q 'not found'; then
    echo "$0: $prog: $(ldd "$prog" | grep 'not found' | head -n 1)" >&2
    exit 2
  fi
  # A program that loads nothing beyond the runtimes leaves grep nothing to print (status 1).
  ldd "$prog" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' |
    { grep -v -E '^(libc|libm|libstdc\+\+|libgcc_s|ld-linux[^ ]*|libpthread|libdl|librt)\.so' || true; } |
    while read -r name path; do
      case " ${SKIP_LIBS:-} " in *" $name "*) continue ;; esac
      cp -L "$path" "$stage/lib/$name"
    done
done
tar cJf "$out" -C "$stage" .
echo "$out: $(du -h "$out" | cut -f1): $(cd "$stage" && find . -type f | sort | tr '\n' ' ')"
