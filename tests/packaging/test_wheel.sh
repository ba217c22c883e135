#!/usr/bin/env bash
# pip's view of the project: builds the wheel from the repository root
# (pyproject.toml: scikit-build-core runs CMake in a temporary directory),
# checks its contents, installs it into a fresh virtual environment (numpy
# comes from its declared dependencies), runs wheel_smoke.py there from
# outside the source tree, checks that `pip install bindings/python` refuses
# with the right command, and that pip wrote nothing into the source tree.
#
# usage: test_wheel.sh SOURCE_DIR WORK_DIR VERSION [SETTINGS_FILE]
# SETTINGS_FILE: pip arguments, one a line: CMake writes there the settings
# its own build used (architectures, options; the compilers come as CC, CXX,
# CUDACXX) so that the library's objects are ccache hits of that build's.
# Exit 77 (skip) when there is no venv module or no PyPI, except under CI
# (CI=true), where this test must run: there that is a failure.
set -euo pipefail
src=$1 work=$2 version=$3
settings=()
[ $# -lt 4 ] || mapfile -t settings < "$4"
here=$(cd "$(dirname "$0")" && pwd)

unavailable() {
  if [ "${CI:-}" = true ]; then echo "FAIL: $* (CI must run this test)"; exit 1; fi
  echo "SKIP: $*"; exit 77
}
fail() { echo "FAIL: $*"; [ $# -lt 2 ] || tail -n 60 "$2"; exit 1; }

rm -rf "$work"
mkdir -p "$work"
cd "$work" # outside the source tree from here on
unset PYTHONPATH FASTPATH_LIB

python3 -m venv "$work/venv" > "$work/venv.log" 2>&1 ||
  unavailable "python3 -m venv does not work (Debian: apt-get install python3-venv): $(tail -n 1 "$work/venv.log")"
py=$work/venv/bin/python
"$py" -m pip download -q --no-deps --retries 1 --timeout 30 -d "$work/probe" scikit-build-core \
  > "$work/probe.log" 2>&1 || unavailable "PyPI is not reachable: $(tail -n 1 "$work/probe.log")"

new_in_tree() { # paths pip and setuptools used to leave in the checkout
  { git -C "$src" status --porcelain --untracked-files=all 2>/dev/null | grep '^??' || true
    ls -d "$src"/*.egg-info "$src"/bindings/python/*.egg-info "$src"/bindings/python/build \
          "$src"/_skbuild 2>/dev/null || true; } | sort
}
before=$(new_in_tree)

echo "== pip wheel $src"
t0=$SECONDS
"$py" -m pip wheel -v --no-deps -w "$work/dist" "$src" "${settings[@]}" > "$work/wheel.log" 2>&1 ||
  fail "pip wheel failed" "$work/wheel.log"
echo "built in $((SECONDS - t0)) s (log: $work/wheel.log)"
whl=("$work/dist"/fastpath-"$version"-py3-none-*.whl)
[ -f "${whl[0]}" ] || fail "no fastpath-$version-py3-none-*.whl in $(ls "$work/dist")"
"$py" - "${whl[0]}" <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
libs = [n for n in names if "libfastpath" in n]
assert libs == ["fastpath/libfastpath.so"], f"library files in the wheel: {libs}"
stray = [n for n in names if not n.startswith(("fastpath/", "fastpath-"))]
assert not stray, f"not the Python package: {stray}"  # headers, CMake package, static library
assert "fastpath/__init__.py" in names and "fastpath/_lib.py" in names
PY

echo "== pip install the wheel into a fresh venv"
t0=$SECONDS
"$py" -m pip install -q "${whl[0]}" > "$work/install.log" 2>&1 || fail "pip install failed" "$work/install.log"
echo "installed in $((SECONDS - t0)) s"
"$py" "$here/wheel_smoke.py" "$version"

echo "== pip install bindings/python refuses, naming the command"
if "$py" -m pip install "$src/bindings/python" > "$work/sub.log" 2>&1; then
  fail "pip install bindings/python succeeded" "$work/sub.log"
fi
grep -q "pip install $src" "$work/sub.log" || fail "no pointer to the repository root" "$work/sub.log"

after=$(new_in_tree)
[ "$before" = "$after" ] || fail "pip wrote into the source tree: $(comm -13 <(echo "$before") <(echo "$after"))"
echo "wheel test OK"
