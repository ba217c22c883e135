#!/usr/bin/env python3
"""The library's host C sources compiled by clang (syntax and warnings, with
the build's own flags and -Werror): the build is GCC's, users' may be clang's
(a builtin or a warning only clang has broke that build before). Exit 77
(skip) without clang.

usage: check_clang.py <build dir> [clang]"""
import json
import os
import shlex
import shutil
import subprocess
import sys


def main():
    build = sys.argv[1]
    clang = sys.argv[2] if len(sys.argv) > 2 else (shutil.which("clang") or "")
    if not clang or not shutil.which(clang):
        print("clang not found: skipped")
        return 77
    with open(os.path.join(build, "compile_commands.json")) as f:
        entries = json.load(f)
    failed, seen = 0, set()
    for e in entries:
        src = e["file"]
        args = shlex.split(e["command"]) if "command" in e else list(e["arguments"])
        # the library's own objects only (tests and benchmarks have other flags)
        if not src.endswith(".c") or "fastpath_objects.dir" not in " ".join(args) or src in seen:
            continue
        seen.add(src)
        out = args.index("-o")
        args = args[:out] + args[out + 2:]
        while args and not args[0].startswith("-"):  # the compiler (and a launcher such as ccache)
            args.pop(0)
        args = [clang] + args + ["-fsyntax-only", "-Werror"]
        r = subprocess.run(args, cwd=e["directory"], capture_output=True, text=True)
        if r.returncode:
            failed += 1
            print(f"FAIL {src}\n{r.stderr[:3000]}")
    print(f"{len(seen)} sources, {failed} failed with {clang}")
    return 1 if failed or not seen else 0


if __name__ == "__main__":
    sys.exit(main())
