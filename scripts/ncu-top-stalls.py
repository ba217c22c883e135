#!/usr/bin/env python3
"""The SASS lines with the most warp-stall samples, from
`ncu --import R --page source --csv --print-source sass > F.csv`:
  ncu-top-stalls.py F.csv [N]
A report of several kernels prints one source table per kernel, each after
a "Kernel Name" line: each is ranked on its own. Per kernel: the columns
found, the warp instructions executed and the stall samples in all, the N
top lines (index, address, samples, share, the instruction), and the samples
per 1/8 of the code so a hot region shows even where no single line
dominates."""
import csv
import sys


def sections(lines):
    """(kernel name, header, rows) per source table; text before the first
    header (ncu's own lines) is skipped."""
    out, name = [], ""
    for line in lines:
        if line.startswith('"Kernel Name"'):
            name = next(csv.reader([line]))[1] if line.count(",") else line
            continue
        row = next(csv.reader([line]), [])
        if row and ("Address" in row[0] or any("Sampling" in c for c in row)):
            out.append((name, row, []))
        elif out and row:
            out[-1][2].append(row)
    return out


def column(head, *keys):
    for i, h in enumerate(head):
        if all(k.lower() in h.lower() for k in keys):
            return i
    return None


def num(r, c):
    if c is None or c >= len(r):
        return 0.0
    try:
        return float(r[c].replace(",", ""))
    except ValueError:
        return 0.0


def report(name, head, rows, n):
    print(f"== {name or 'kernel'}")
    print("columns:", " | ".join(head)[:1500])
    c_all = column(head, "stall sampling", "all")
    if c_all is None:
        c_all = column(head, "sampling")
    c_ni, c_src, c_addr = column(head, "stall sampling", "not"), column(head, "source"), column(head, "address")
    c_exec = column(head, "instructions executed")
    if c_all is None or c_src is None:
        print("no sampling / source column")
        return 1
    body = [r for r in rows if len(r) > c_src]
    total = sum(num(r, c_all) for r in body)
    executed = sum(num(r, c_exec) for r in body)
    print(f"{len(body)} SASS lines, {executed:.0f} warp instructions executed, {total:.0f} stall samples (all)")
    if not total:
        return 0
    top = sorted(range(len(body)), key=lambda i: -num(body[i], c_all))[:n]
    for i in sorted(top):
        r = body[i]
        a = r[c_addr] if c_addr is not None and c_addr < len(r) else str(i)
        ni = f" not-issued {num(r, c_ni):6.0f}" if c_ni is not None else ""
        print(f"{i:6d} {a:>8} {num(r, c_all):7.0f} {100 * num(r, c_all) / total:5.1f}%{ni}  {r[c_src][:110]}")
    k = max(1, len(body) // 8)
    print("samples per eighth of the code:",
          " ".join(f"{100 * sum(num(r, c_all) for r in body[j:j + k]) / total:.1f}%" for j in range(0, len(body), k)))
    return 0


def main():
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    with open(sys.argv[1], newline="", errors="replace") as f:
        lines = f.read().splitlines()
    found = sections(lines)
    if not found:
        print("no CSV header found; first lines:")
        print("\n".join(lines[:10]))
        return 1
    return max(report(name, head, rows, n) for name, head, rows in found)


if __name__ == "__main__":
    sys.exit(main())
