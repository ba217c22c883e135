#!/usr/bin/env bash
# usage: run_consumer.sh BUILD_DIR SCRATCH_DIR PROJECT_DIR C_COMPILER
set -euo pipefail
build=$1 scratch=$2 project=$3 cc=$4
rm -rf "$scratch"
mkdir -p "$scratch"
prefix=$scratch/prefix

echo "== install into $prefix"
cmake --install "$build" --prefix "$prefix" > "$scratch/install.log"
test -f "$prefix/include/fastpath/fastpath.h"
libdir=$(dirname "$(find "$prefix" -name 'libfastpath.so' | head -n1)")
test -f "$libdir/libfastpath.a"

echo "== exported symbols: only the fp_ API"
bad=$(nm -D --defined-only "$libdir/libfastpath.so" | awk '$2 ~ /^[TDBRVW]$/ {print $3}' | grep -v '^fp_' || true)
if [ -n "$bad" ]; then
  echo "non-API symbols exported from libfastpath.so:"; echo "$bad" | head -20; exit 1
fi

# With the attention capability the consumer also runs a CPU attention: a
# static consumer then needs the library's BLAS (BLIS) dependency.
cflags=()
exported=$(nm -D --defined-only "$libdir/libfastpath.so") # (grep -q on a pipe: SIGPIPE under pipefail)
if grep -q ' fp_attention_forward$' <<< "$exported"; then
  cflags=(-DFP_CONSUMER_ATTENTION=1)
fi

echo "== find_package(fastpath), shared and static"
for target in fastpath::fastpath fastpath::fastpath_static; do
  dir=$scratch/cmake-$(echo "$target" | tr ':' '_')
  cmake -S "$project" -B "$dir" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_COMPILER="$cc" \
        -DFASTPATH_TARGET="$target" -DCMAKE_C_FLAGS="${cflags[*]:-}" > "$dir.log" 2>&1 || { cat "$dir.log"; exit 1; }
  cmake --build "$dir" >> "$dir.log" 2>&1 || { cat "$dir.log"; exit 1; }
  "$dir/consumer"
done

echo "== pkg-config"
export PKG_CONFIG_PATH="$libdir/pkgconfig"
pkg-config --exists fastpath
# shellcheck disable=SC2046
"$cc" -std=c11 -Wall -Wextra -Werror "${cflags[@]}" "$project/main.c" -o "$scratch/consumer-pc" $(pkg-config --cflags --libs fastpath)
"$scratch/consumer-pc"

echo "== pkg-config --static (libfastpath.a with Libs.private)"
# shellcheck disable=SC2046
"$cc" -std=c11 -Wall -Wextra -Werror "${cflags[@]}" "$project/main.c" -o "$scratch/consumer-pc-static" \
  $(pkg-config --cflags fastpath) "$libdir/libfastpath.a" \
  $(pkg-config --static --libs fastpath | sed 's/ -lfastpath / /')
"$scratch/consumer-pc-static"
echo "consumer OK"
