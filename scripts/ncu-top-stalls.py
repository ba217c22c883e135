#!/usr/bin/env python3
"""The SASS lines with the most warp-stall samples, from
`ncu --import R --page source --csv --print-source sass > F.csv`:
  ncu-top-stalls.py F.csv [N]
Prints the columns found, the total samples, then the N top lines (address,
samples, share, the instruction), and the samples per 1/8 of the code so a
hot region shows even where no single line dominates."""
import csv
import sys


def main():
    path = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    with open(path, newline="", errors="replace") as f:
        lines = f.read().splitlines()
    # ncu may print text before the CSV header: start at the first line
    # that names a sampling column
    start = next((i for i, l in enumerate(lines) if "Sampling" in l or "Address" in l), None)
    if start is None:
        print("no CSV header found; first lines:")
        print("\n".join(lines[:10]))
        return 1
    rows = list(csv.reader(lines[start:]))
    head = rows[0]
    print("columns:", " | ".join(head)[:1500])

    def col(*keys):
        for i, h in enumerate(head):
            if all(k.lower() in h.lower() for k in keys):
                return i
        return None

    c_all = col("stall sampling", "all")
    if c_all is None:
        c_all = col("sampling")
    c_ni = col("stall sampling", "not")
    c_src = col("source")
    c_addr = col("address")
    if c_all is None or c_src is None:
        print("no sampling / source column")
        return 1

    def num(r, c):
        if c is None or c >= len(r):
            return 0.0
        try:
            return float(r[c].replace(",", ""))
        except ValueError:
            return 0.0

    body = [r for r in rows[1:] if len(r) > c_src]
    total = sum(num(r, c_all) for r in body)
    print(f"{len(body)} SASS lines, {total:.0f} stall samples (all)")
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


if __name__ == "__main__":
    sys.exit(main())
