"""The host cost of reaching a CUDA tensor's fastpath context and stream from
Python, measured on any machine (no GPU, no driver needed):

  FASTPATH_LIB=build/libfastpath.so PYTHONPATH=bindings/python \
      python benchmarks/python/launch_path_cost.py [--calls 20000]

  guard path  fastpath.torch._Launch (torch.cuda.device entered and left,
              context_for, torch.cuda.current_stream(dev).cuda_stream): what
              every CUDA call took before session 40, and what a tensor on a
              device other than the current one still takes
  fast path   fastpath.torch._call for a tensor on the current device (the
              raw current-device and current-stream queries, the cached
              context), with a library call that returns at once

torch's Python runs as it is (_get_device_index, the guard, Stream.__new__'s
checks); its calls that need a driver (_lazy_init, _exchange_device,
_getCurrentStream, the C Stream object, _cuda_getDevice,
_cuda_getCurrentRawStream) are replaced by trivial Python stand-ins, so both
rows are lower bounds: a GPU adds the real calls (the driver's current-device
query, a few hundred ns each) to each. Prints us per call, best of 7 repeats.
"""
import argparse
import sys
import timeit
import types

try:
    import torch
    import torch.cuda
except ImportError:
    sys.stderr.write("launch_path_cost.py: torch is not installed; nothing to measure\n")
    sys.exit(0)

import fastpath.torch as fpt


class _Stream:
    """torch.cuda.Stream's Python __new__ (its checks), the C object replaced."""

    def __new__(cls, device=None, priority=0, **kwargs):
        if not torch.backends.cuda.is_built():
            raise RuntimeError("torch.cuda.Stream requires CUDA support")
        if device is None or ("stream_id" in kwargs and "device_index" in kwargs):
            s = object.__new__(cls)
            s.cuda_stream = 0
            return s
        raise RuntimeError("stand-in: only current_stream()'s construction")


def stand_in():
    """Replace torch's driver-bound calls and give device 0 a stand-in context."""
    torch.cuda._lazy_init = lambda: None
    torch.cuda._exchange_device = lambda idx: 0
    torch.cuda._maybe_exchange_device = lambda idx: 0
    torch._C._cuda_getCurrentStream = lambda idx: (0, 0, 1)
    torch.cuda.Stream = _Stream
    ctx = types.SimpleNamespace(handle=None)
    fpt._contexts["cuda:0"] = ctx  # what context_for returns for cuda:0
    fpt._cuda_contexts[0] = ctx
    fpt._CURRENT_DEVICE = lambda: 0
    fpt._RAW_STREAM = lambda idx: 0
    fpt._FAST_LAUNCH = True


class _Tensor:
    """What _call and _Launch read of a CUDA tensor on device 0."""
    is_cuda = True
    device = torch.device("cuda:0")

    def get_device(self):
        return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20000)
    args = ap.parse_args()
    stand_in()
    t = _Tensor()

    def guard_path():
        with fpt._Launch(t) as (ctx, stream):
            return ctx.handle, stream

    def noop(handle, stream, params):
        return 0

    def fast_path():
        fpt._call(t, noop, None)

    if guard_path() != (None, 0x1):
        sys.exit("launch_path_cost.py: the guard path did not give the legacy stream")
    print(f"torch {torch.__version__}, python {sys.version.split()[0]}: us per call, best of 7 x "
          f"{args.calls} (torch's driver calls stubbed: lower bounds)")
    for name, fn in (("guard path (_Launch)", guard_path), ("fast path (_call)", fast_path)):
        us = min(timeit.repeat(fn, number=args.calls, repeat=7)) / args.calls * 1e6
        print(f"{name:24s} {us:7.2f}")


if __name__ == "__main__":
    main()
