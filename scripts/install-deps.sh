#!/usr/bin/env bash
# Installs what the build and the tests need beyond the CUDA toolkit, from
# Debian's packages and PyPI, only when missing:
#   cmake >= 3.25, ninja, pkg-config, cJSON (libcjson-dev), SQLite 3
#   (libsqlite3-dev: the trace export's database), BLIS (libblis-dev:
#   the CPU attention's tile GEMMs; without it a slower portable path builds),
#   ccache (optional),
#   pytest (for fastbench's CLI tests and the Python bindings' tests),
#   matplotlib (fastbench report's charts),
#   python3-venv (tests/packaging installs the wheel into a fresh venv).
# With FASTPATH_TEST_TORCH=1 (CI sets it), also PyTorch from PyPI (a few GB),
# so that the fastpath.torch drop-ins are tested against torch.nn.functional
# on the CPU instead of skipping.
set -euo pipefail

need_apt=()
have_pkg() { dpkg -s "$1" >/dev/null 2>&1; }
command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)
command -v ninja >/dev/null 2>&1 || need_apt+=(ninja-build)
command -v pkg-config >/dev/null 2>&1 || need_apt+=(pkg-config)
command -v ccache >/dev/null 2>&1 || need_apt+=(ccache)
if ! have_pkg libcjson-dev && [ ! -f /usr/include/cjson/cJSON.h ]; then need_apt+=(libcjson-dev); fi
if ! have_pkg libsqlite3-dev && [ ! -f /usr/include/sqlite3.h ]; then need_apt+=(libsqlite3-dev); fi
# any BLIS flavour (openmp / pthread / serial) provides blis.h and libblis.so
# (one header found is enough: `ls` of several paths fails when any is absent)
have_blis_header() {
  local h
  for h in /usr/include/blis.h /usr/include/*/blis.h /usr/include/blis/blis.h; do
    [ -f "$h" ] && return 0
  done
  return 1
}
if ! have_pkg libblis-dev && ! have_blis_header; then need_apt+=(libblis-dev); fi
if ! command -v python3 >/dev/null 2>&1; then
  need_apt+=(python3 python3-pip python3-venv)
elif ! python3 -m pip --version >/dev/null 2>&1 &&
     { ! python3 -c "import pytest, numpy" >/dev/null 2>&1 || ! python3 -c "import matplotlib" >/dev/null 2>&1 ||
       { [ "${FASTPATH_TEST_TORCH:-0}" = 1 ] && ! python3 -c "import torch" >/dev/null 2>&1; }; }; then
  need_apt+=(python3-pip) # Debian's python3 comes without pip: the pip installs below need it
fi
# and without venv's ensurepip: tests/packaging installs the wheel into a venv
if command -v python3 >/dev/null 2>&1 && ! python3 -c "import ensurepip, venv" >/dev/null 2>&1; then
  need_apt+=(python3-venv)
fi

if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "install-deps: apt-get install ${need_apt[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  else
    echo "install-deps: missing ${need_apt[*]}: install them (Debian: sudo apt-get install ${need_apt[*]})" >&2
    exit 1
  fi
fi

pip_install() {
  python3 -m pip install -q "$@" 2>/dev/null ||
    python3 -m pip install -q --break-system-packages "$@" 2>/dev/null ||
    python3 -m pip install -q --user "$@"
}

if ! python3 -c "import pytest, numpy" >/dev/null 2>&1; then
  echo "install-deps: pip install pytest numpy"
  pip_install pytest numpy
fi

if ! python3 -c "import matplotlib" >/dev/null 2>&1; then
  echo "install-deps: pip install matplotlib (fastbench report)"
  pip_install matplotlib
fi

# cuobjdump + nvdisasm (tests/sass reads the kernels' SASS): part of a full CUDA
# toolkit; a toolkit without them gets NVIDIA's PyPI wheels of the same major version.
nvcc_bin="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
cuda_bin="$(dirname "$nvcc_bin")"
if ! { [ -x "$cuda_bin/cuobjdump" ] && [ -x "$cuda_bin/nvdisasm" ]; } &&
   ! { command -v cuobjdump >/dev/null 2>&1 && command -v nvdisasm >/dev/null 2>&1; } &&
   ! python3 -c "import glob, nvidia, sys; sys.exit(not any(glob.glob(p + '/*/bin/nvdisasm') for p in nvidia.__path__))" \
     >/dev/null 2>&1; then
  major="$("$nvcc_bin" --version 2>/dev/null | sed -n 's/.*release \([0-9]*\)\..*/\1/p')"
  spec=""
  [ -n "$major" ] && spec=">=${major},<$((major + 1))"
  echo "install-deps: pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm (${spec:-any version})"
  pip_install "nvidia-cuda-cuobjdump${spec}" "nvidia-cuda-nvdisasm${spec}" ||
    echo "install-deps: WARNING: no cuobjdump / nvdisasm: the SASS checks (tests/sass) will skip" >&2
fi

if [ "${FASTPATH_TEST_TORCH:-0}" = 1 ] && ! python3 -c "import torch" >/dev/null 2>&1; then
  # 2.15 is the release the tests were last run with; a newer one if it cannot be had.
  echo "install-deps: pip install torch (FASTPATH_TEST_TORCH=1)"
  if ! pip_install "torch==2.15.*" && ! pip_install "torch>=2.5"; then
    echo "install-deps: WARNING: could not install torch: the fastpath.torch tests will skip" >&2
  fi
fi
