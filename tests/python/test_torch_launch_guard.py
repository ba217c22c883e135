"""fastpath.torch's _Launch with a stand-in torch (runs without torch and
without a GPU, in a subprocess so the stand-in never meets a real torch):
creating a fastpath context makes its device current (cudaSetDevice), so the
device guard must be entered first, or it would "restore" the tensor's
device instead of the caller's."""
import subprocess
import sys
import textwrap


CODE = textwrap.dedent("""
    import sys, types

    state = {"device": 0}

    class DeviceGuard:
        def __init__(self, dev):
            self.idx = dev.index
        def __enter__(self):
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
    print("ok")
""")


def test_launch_guard_restores_callers_device():
    r = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr + r.stdout
