"""fastpath.torch's _Launch with a stand-in torch (runs without torch and
without a GPU, in a subprocess so the stand-in never meets a real torch):
creating a fastpath context makes its device current (cudaSetDevice), so the
device guard must be entered first, or it would "restore" the tensor's
device instead of the caller's. And _call's fast path (a stand-in torch._C
with the current device and raw stream queries): a tensor on the current
device is called with no guard, on torch's current stream, its device's
context made once; one on another device goes through the guard."""
import subprocess
import sys
import textwrap


CODE = textwrap.dedent("""
    import sys, types

    state = {"device": 0, "guards": 0}
    FAST = len(sys.argv) > 1 and sys.argv[1] == "fast"

    class DeviceGuard:
        def __init__(self, dev):
            self.idx = dev.index
        def __enter__(self):
            state["guards"] += 1
            self.prev = state["device"]      # torch asks the runtime (cudaGetDevice)
            state["device"] = self.idx
        def __exit__(self, *exc):
            state["device"] = self.prev
            return False

    class Device:
        def __init__(self, type, index=None):
            self.type, self.index = type, index

    def device(spec):
        if isinstance(spec, Device):
            return spec
        t, _, i = spec.partition(":")
        return Device(t, int(i) if i else None)

    torch = types.ModuleType("torch")
    torch.float32, torch.float16, torch.bfloat16 = "f32", "f16", "bf16"
    torch.device = device
    torch.cuda = types.SimpleNamespace(
        device=DeviceGuard, current_device=lambda: state["device"],
        current_stream=lambda dev=None: types.SimpleNamespace(cuda_stream=0))
    nn = types.ModuleType("torch.nn")
    fn = types.ModuleType("torch.nn.functional")
    fn.gelu = fn.relu = fn.silu = lambda *a, **k: None
    nn.functional = fn
    torch.nn = nn
    autograd = types.ModuleType("torch.autograd")
    afn = types.ModuleType("torch.autograd.function")
    afn.once_differentiable = lambda f: f
    autograd.Function = object
    autograd.function = afn
    torch.autograd = autograd
    if FAST:  # torch's C queries: the current device, the current stream's handle
        torch._C = types.SimpleNamespace(
            _cuda_getDevice=lambda: state["device"],
            _cuda_getCurrentRawStream=lambda idx: state.get("stream%d" % idx, 0))
    sys.modules.update({"torch": torch, "torch.nn": nn, "torch.nn.functional": fn,
                        "torch.autograd": autograd, "torch.autograd.function": afn})

    import fastpath.torch as fpt

    def fake_context_for(dev):                # fp_context_create: cudaSetDevice(dev)
        state["device"] = dev.index
        return "ctx%d" % dev.index
    fpt.context_for = fake_context_for

    t = types.SimpleNamespace(device=Device("cuda", 1))
    with fpt._Launch(t) as (ctx, stream):
        assert ctx == "ctx1" and stream == 0x1 and state["device"] == 1
    assert state["device"] == 0, "caller's device not restored: %r" % state
    # a failing context creation leaves the caller's device too
    def failing(dev):
        state["device"] = dev.index
        raise RuntimeError("no such device")
    fpt.context_for = failing
    try:
        with fpt._Launch(t):
            pass
    except RuntimeError:
        pass
    assert state["device"] == 0, state
    if not FAST:
        assert not fpt._FAST_LAUNCH
        print("ok")
        sys.exit(0)

    # _call's fast path
    assert fpt._FAST_LAUNCH
    made = []
    def counting(dev):                        # as fake_context_for, counted
        made.append(dev.index)
        state["device"] = dev.index
        return types.SimpleNamespace(handle="ctx%d" % dev.index)
    fpt.context_for = counting
    calls = []
    def fn(handle, stream, params):           # the library call: records, returns FP_OK
        calls.append((handle, stream, params, state["device"]))
        return 0
    class T:
        is_cuda = True
        def __init__(self, index):
            self.device = Device("cuda", index)
        def get_device(self):
            return self.device.index
    state["guards"] = 0
    for i in range(3):
        fpt._call(T(0), fn, "p%d" % i)
    assert state["guards"] == 0, "a guard entered for a tensor on the current device: %r" % state
    assert made == [0], "device 0's context made %d times" % len(made)
    # the legacy default stream (raw 0) by its handle, as _Launch passes it
    assert calls == [("ctx0", 0x1, "p%d" % i, 0) for i in range(3)], calls
    state["stream0"] = 0x5000                 # a side stream made current (torch.cuda.stream(s))
    fpt._call(T(0), fn, "q")
    assert calls[-1] == ("ctx0", 0x5000, "q", 0), calls[-1]
    # another device: through the guard, which restores the caller's device
    fpt._call(T(1), fn, "r")
    assert state["guards"] == 1 and calls[-1] == ("ctx1", 0x1, "r", 1), (state, calls[-1])
    assert state["device"] == 0, "caller's device not restored: %r" % state
    assert made == [0, 1], made
    # the caller switched to device 1: now the fast path for device 1's tensors
    state["device"] = 1
    fpt._call(T(1), fn, "s")
    assert state["guards"] == 1 and calls[-1] == ("ctx1", 0x1, "s", 1), (state, calls[-1])
    assert made == [0, 1, 1], made            # the guard path's context is context_for's own cache
    # a refusal still raises
    import fastpath
    try:
        fpt._call(T(1), lambda h, s, p: fastpath.Status.INVALID_ARGUMENT, "t")
    except fastpath.FastpathError as e:
        assert e.status == fastpath.Status.INVALID_ARGUMENT
    else:
        raise AssertionError("a refused call did not raise")
    print("ok")
""")


def test_launch_guard_restores_callers_device():
    r = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr + r.stdout


def test_fast_call_skips_the_guard_on_the_current_device():
    r = subprocess.run([sys.executable, "-c", CODE, "fast"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr + r.stdout
