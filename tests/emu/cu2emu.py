#!/usr/bin/env python3
"""Rewrites a CUDA source for the CPU emulation (tests/emu/cuda_emu.h).

Only what the host compiler cannot parse changes, and every line keeps its
number (a #line directive names the original file):
  kernel<<<grid, block, smem, stream>>>(args)
      -> fp_emu::make_launch(kernel, grid, block, smem, stream)(args)
  extern __shared__ __align__(N) T name[];
      -> T *name = reinterpret_cast<T *>(fp_emu::dynamic_smem());
  __global__ void __launch_bounds__(B, ...) kernel(params) {
      -> __global__ void kernel(params) { fp_emu::check_launch_bounds(B);
     (a block above the bound fails the launch, as the hardware refuses it)

usage: cu2emu.py IN.cu OUT.cpp
"""
import re
import sys

EXTERN_SHARED = re.compile(
    r"extern\s+__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s+)?([A-Za-z_][\w:]*(?:\s+[A-Za-z_][\w:]*)*?)\s+"
    r"(\w+)\s*\[\s*\]\s*;")


def rewrite_launches(src):
    out = []
    pos = 0
    while True:
        i = src.find("<<<", pos)
        if i < 0:
            out.append(src[pos:])
            return "".join(out)
        # The callee: an identifier (with ::) and an optional template
        # argument list, right before <<<.
        j = i
        while j > 0 and src[j - 1].isspace():
            j -= 1
        if src[j - 1] == ">":
            depth = 0
            k = j - 1
            while k >= 0:
                if src[k] == ">":
                    depth += 1
                elif src[k] == "<":
                    depth -= 1
                    if depth == 0:
                        break
                k -= 1
            if k < 0:
                sys.exit("cu2emu: unbalanced template arguments before <<< at offset %d" % i)
            j = k
        k = j
        while k > 0 and (src[k - 1].isalnum() or src[k - 1] in "_:"):
            k -= 1
        raw = src[k:i]
        callee = raw.rstrip()
        # A line break between the kernel and <<< (a long template name)
        # goes after the rewritten call, so the lines keep their numbers.
        lost = raw[len(callee):].count("\n")
        if not callee or not (callee[0].isalpha() or callee[0] in "_:"):
            sys.exit("cu2emu: no kernel name before <<< at offset %d" % i)
        e = src.find(">>>", i)
        if e < 0:
            sys.exit("cu2emu: <<< without >>> at offset %d" % i)
        config = src[i + 3:e]
        out.append(src[pos:k])
        out.append("fp_emu::make_launch(%s, %s)%s" % (callee, config, "\n" * lost))
        pos = e + 3


def match_paren(src, i):
    """Index of the parenthesis closing the one at src[i]."""
    depth = 0
    for k in range(i, len(src)):
        if src[k] == "(":
            depth += 1
        elif src[k] == ")":
            depth -= 1
            if depth == 0:
                return k
    sys.exit("cu2emu: unbalanced parentheses at offset %d" % i)


def rewrite_launch_bounds(src):
    out = []
    pos = 0
    while True:
        i = src.find("__launch_bounds__", pos)
        if i < 0:
            out.append(src[pos:])
            return "".join(out)
        j = i + len("__launch_bounds__")
        while j < len(src) and src[j].isspace():
            j += 1
        if j >= len(src) or src[j] != "(":
            out.append(src[pos:j])
            pos = j
            continue
        k = match_paren(src, j)
        # The first argument (max threads per block), up to a top-level comma.
        args, depth, cut = src[j + 1:k], 0, None
        for n, ch in enumerate(args):
            depth += ch in "(<[" and 1 or ch in ")>]" and -1 or 0
            if ch == "," and depth == 0:
                cut = n
                break
        bound = " ".join(args[:cut].split())
        out.append(src[pos:i])
        out.append("\n" * src[i:k + 1].count("\n"))  # keep the line count
        # The definition's body: after the name and the parameter list.
        p = src.find("(", k + 1)
        q = match_paren(src, p) if p >= 0 else -1
        r = q + 1
        while 0 <= q and r < len(src) and src[r].isspace():
            r += 1
        if q >= 0 and r < len(src) and src[r] == "{":
            out.append(src[k + 1:r + 1])
            out.append(" fp_emu::check_launch_bounds(%s);" % bound)
            pos = r + 1
        else:  # a declaration
            pos = k + 1


def rewrite_extern_shared(src):
    return EXTERN_SHARED.sub(
        lambda m: "%s *%s = reinterpret_cast<%s *>(fp_emu::dynamic_smem());" % (m.group(1), m.group(2),
                                                                                m.group(1)), src)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        src = f.read()
    body = rewrite_extern_shared(rewrite_launches(rewrite_launch_bounds(src)))
    if body.count("\n") != src.count("\n"):
        sys.exit("cu2emu: rewriting changed the line count of %s" % sys.argv[1])
    with open(sys.argv[2], "w") as f:
        f.write('#include "cuda_emu.h"\n#line 1 "%s"\n' % sys.argv[1])
        f.write(body)


if __name__ == "__main__":
    main()
