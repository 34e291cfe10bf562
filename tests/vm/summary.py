#!/usr/bin/env python3
"""The table of a tests/vm run, from its raw output (the pods' JSON lines).

    summary.py OUT_DIR WRITER:OWNER ...

For each writer -> owner pair: the writer's kv-put (write, read back) and the
owner's kv-serve (every byte checked after the notification). Prints a
Markdown table and writes it to OUT_DIR/summary.md; exits 1 when a pair did
not pass.
"""
import json
import os
import sys


def events(*paths):
    out = {}
    for p in paths:
        if os.path.exists(p):
            for line in open(p):
                if line.startswith("{"):
                    d = json.loads(line)
                    out[d.get("event")] = d
    return out


def main():
    out = sys.argv[1]
    rows = ["| writer -> owner | result | write | read back | owner's check |", "|---|---|---|---|---|"]
    ok = True
    for pair in sys.argv[2:]:
        me, peer = pair.split(":")
        ev = events(os.path.join(out, f"{me}.put-{peer}.out"), os.path.join(out, f"{peer}.serve-{me}.out"))
        p, r, v = ev.get("put"), ev.get("read_back"), ev.get("verified")
        good = (p is not None and p.get("transport", "").endswith("mesh") and r is not None
                and r["mismatches"] == 0 and v is not None and v["mismatches"] == 0)
        ok &= good
        w = f"{p['bytes']} B, {p['seconds']:.2f} s ({p['bytes'] / p['seconds'] / 1e6:.1f} MB/s)" if p else "-"
        b = f"{r['seconds']:.2f} s, {r['mismatches']} wrong" if r else "-"
        c = f"{v['bytes']} B, {v['mismatches']} wrong, notified {v.get('notification')}" if v else "-"
        rows.append(f"| {me} -> {peer} | {'ok' if good else 'FAILED'} | {w} | {b} | {c} |")
    text = "\n".join(rows) + "\n"
    print(text, end="")
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
