# Sourced by the other scripts: finds the CUDA toolkit when nvcc is not on PATH.
if ! command -v nvcc >/dev/null 2>&1; then
  for d in /usr/local/cuda/bin /usr/local/cuda-13/bin /opt/cuda/bin; do
    if [ -x "$d/nvcc" ]; then export PATH="$d:$PATH"; break; fi
  done
fi
if ! command -v nvcc >/dev/null 2>&1; then
  echo "error: nvcc not found: install the CUDA toolkit (13.x) or put its bin/ on PATH" >&2
  exit 1
fi
FP_JOBS=${FP_JOBS:-$(nproc 2>/dev/null || echo 2)}
export FP_JOBS
