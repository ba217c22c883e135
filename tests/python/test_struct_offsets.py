"""The ctypes mirrors of the params structs against the C headers, field by
field: a small C program prints sizeof and every offsetof (needs a C compiler;
skipped without one)."""
import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

from fastpath import _lib, comm, graph, trace

ROOT = Path(__file__).resolve().parents[2]
STRUCTS = [("fp_norm_params", "fastpath/norm.h", _lib.NormParams),
           ("fp_norm_backward_params", "fastpath/norm.h", _lib.NormBackwardParams),
           ("fp_attention_params", "fastpath/attention.h", _lib.AttentionParams),
           ("fp_timing_config", "fastpath/timing.h", _lib.TimingConfig),
           ("fp_ab_report", "fastpath/timing.h", _lib.ABReport),
           ("fp_device_info", "fastpath/core.h", _lib.DeviceInfo),
           ("fp_attention_kernel_info", "fastpath/attention.h", _lib.AttentionKernelInfo)]
STRUCTS += [("fp_comm_id", "fastpath/comm.h", comm.CommId),
            ("fp_comm_failure_info", "fastpath/comm.h", comm.FailureInfo),
            ("fp_comm_config", "fastpath/comm.h", comm.CommConfig),
            ("fp_coll_record", "fastpath/comm.h", comm.CollRecord),
            ("fp_coll_stats", "fastpath/comm.h", comm.CollStats),
            ("fp_comm_stats", "fastpath/comm.h", comm.CommStats),
            ("fp_coll_bench", "fastpath/comm.h", comm.CollBench),
            ("fp_comm_tensor", "fastpath/comm.h", comm.CommTensor),
            ("fp_buckets_config", "fastpath/comm.h", comm.BucketsConfig)]
if trace.available():
    STRUCTS += [("fp_trace_span", "fastpath/trace.h", trace.Span),
                ("fp_trace_stats", "fastpath/trace.h", trace.TraceStats),
                ("fp_trace_roofs", "fastpath/trace.h", trace.Roofs),
                ("fp_trace_verdict", "fastpath/trace.h", trace.Verdict)]
if graph.available():
    STRUCTS += [("fp_graph_config", "fastpath/graph.h", graph.Config),
                ("fp_graph_info", "fastpath/graph.h", graph.Info),
                ("fp_graph_bucket_cost", "fastpath/graph.h", graph.BucketCost),
                ("fp_graph_cache_config", "fastpath/graph.h", graph.CacheConfig),
                ("fp_graph_cache_stats", "fastpath/graph.h", graph.CacheStats)]


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler")
    d = tmp_path_factory.mktemp("layout")
    lines = ["#include <stdio.h>", "#include <stddef.h>"]
    lines += sorted({f'#include "{h}"' for _, h, _ in STRUCTS})
    lines.append("int main(void) {")
    for name, _, cls in STRUCTS:
        lines.append(f'    printf("{name} sizeof %zu\\n", sizeof({name}));')
        for field, _ in cls._fields_:
            lines.append(f'    printf("{name} {field} %zu\\n", offsetof({name}, {field}));')
    lines += ["    return 0;", "}"]
    src = d / "layout.c"
    src.write_text("\n".join(lines) + "\n")
    exe = d / "layout"
    r = subprocess.run([cc, "-std=c11", "-I", str(ROOT / "include"), str(src), "-o", str(exe)],
                       capture_output=True, text=True)
    assert r.returncode == 0, f"a ctypes field is missing from the C struct?\n{r.stderr}"
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    return {tuple(line.split()[:2]): int(line.split()[2]) for line in out.splitlines()}


@pytest.mark.parametrize("name,header,cls", STRUCTS, ids=[s[0] for s in STRUCTS])
def test_layout_matches_header(c_layout, name, header, cls):
    assert c_layout[(name, "sizeof")] == ctypes.sizeof(cls), "size differs (a field missing?)"
    for field, _ in cls._fields_:
        assert c_layout[(name, field)] == getattr(cls, field).offset, field
