#!/usr/bin/env python3
"""Tables for docs/soak.md from podlink-soak's raw logs (docs/soak/*.log).

  summarize.py LOG...                     print the tables (Markdown)
  summarize.py --update docs/soak.md LOG...   replace what lies between
      <!-- soak-results:begin --> and <!-- soak-results:end --> with them

Every number in the tables comes from a log; nothing is typed by hand.
"""
import argparse
import os
import re
import sys

BEGIN = "<!-- soak-results:begin -->"
END = "<!-- soak-results:end -->"


def kv(text):
    """key=value pairs of a log line (values end at a space)."""
    return dict(re.findall(r"(\w+)=(\S+)", text))


def parse(path):
    run = {"path": path, "progress": [], "faults": 0}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            tag, _, rest = line.partition(": ")
            if tag == "fault":
                run["faults"] += 1
            elif tag == "progress":
                run["progress"].append(kv(rest))
            elif tag in ("soak", "machine", "options", "start", "baseline", "final", "summary", "relay",
                         "delta", "git"):
                run[tag] = kv(rest)
                run[tag + "_text"] = rest
            elif tag in ("runner", "command", "result", "faults", "expected-errors", "fds-diff", "maps-diff",
                         "threads-diff", "daemon-log"):
                run[tag] = rest
    return run


def mib(kib):
    return "%.1f" % (int(kib) / 1024.0)


def runs_table(runs):
    out = ["| log | date (UTC) | machine | cycles (clean / faulted) | time | rate | daemon fds | daemon maps | "
           "daemon threads | daemon RSS MiB | bytes checked | mismatches | result |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        m, s, b, fi = r.get("machine", {}), r.get("summary", {}), r.get("baseline", r.get("start", {})), \
            r.get("final", {})
        machine = "%s: %s cores, %s GiB, Linux %s" % (m.get("host", "?"), m.get("nproc", "?"),
                                                    "%.0f" % (int(m.get("mem_kib", 0)) / 1048576.0),
                                                    m.get("kernel", "?"))
        result = re.sub(r" \(daemon log and pod stderr kept in .*\)$", "",
                        r.get("result", "(no result: run did not finish)"))
        out.append("| `%s` | %s | %s | %s (%s / %s) | %s s | %s /s | %s → %s | %s → %s | %s → %s | %s → %s | %.1f GiB "
                   "| %s | %s |" % (
            os.path.basename(r["path"]), r.get("soak", {}).get("date", "?"), machine, s.get("cycles", "?"),
            s.get("clean", "?"), s.get("faulted", "?"), s.get("seconds", "?"), s.get("rate", "?"),
            b.get("fds", "?"), fi.get("fds", "?"), b.get("maps", "?"), fi.get("maps", "?"),
            b.get("threads", "?"), fi.get("threads", "?"),
            mib(b.get("rss_kib", 0)), mib(fi.get("rss_kib", 0)), int(s.get("bytes_checked", 0)) / 2**30,
            s.get("mismatches", "?"), result))
    return out


def detail(r):
    s, rel = r.get("summary", {}), r.get("relay", {})
    out = ["### `%s`" % os.path.basename(r["path"]), ""]
    if "runner" in r:
        out.append("Command: `%s` (it ran `%s`)" % (r["runner"], r.get("command", "?")))
    else:
        out.append("Command: `%s`" % r.get("command", "?"))
    if "git" in r:
        out.append("")
        out.append("Source: `%s`" % r["git_text"])
    out += ["", "| | |", "|---|---|"]
    rows = [
        ("machine", r.get("machine_text", "?")),
        ("options", r.get("options_text", "?")),
        ("cycles", "%s measured (%s clean, %s with a fault) after %s warm-up cycles" % (
            s.get("cycles"), s.get("clean"), s.get("faulted"), s.get("warmup_cycles"))),
        ("faults", r.get("faults", "?")),
        ("errors the faults caused (step:code)", r.get("expected-errors", "?")),
        ("pod restarts / session resets / abandoned transfers", "%s / %s / %s" % (
            s.get("restarts"), s.get("resets"), s.get("abandoned"))),
        ("imports dropped without release", s.get("drops", "?")),
        ("offers left behind by exiting pods", s.get("offers_left", "?")),
        ("relay", "%s ops, %.2f GiB, %s failed, %s notifications, %s broken rings" % (
            rel.get("ops"), float(rel.get("bytes", 0)) / 2**30, rel.get("failed"), rel.get("notifies"),
            rel.get("broken_rings"))),
        ("daemon totals", "%s sessions, %s exports, %s imports" % (
            rel.get("sessions_total"), rel.get("exports_total"), rel.get("imports_total"))),
        ("bytes checked / mismatches / notifications lost", "%.2f GiB / %s / %s" % (
            int(s.get("bytes_checked", 0)) / 2**30, s.get("mismatches"), s.get("notify_lost"))),
        ("unexpected errors / worker exits", "%s / %s" % (s.get("unexpected_errors"), s.get("unexpected_exits"))),
        ("daemon at start (fresh)", r.get("start_text", "?")),
        ("baseline (after warm-up, pods gone)", r.get("baseline_text", "?")),
        ("final (after the run, pods gone)", r.get("final_text", "?")),
        ("final − baseline", r.get("delta_text", "?")),
        ("descriptors, final vs baseline", r.get("fds-diff", "?")),
        ("mappings, final vs baseline", r.get("maps-diff", "?")),
        ("threads, final vs baseline", r.get("threads-diff", "(not recorded by this version)")),
        ("daemon log (warn and above)", r.get("daemon-log", "?")),
        ("result", r.get("result", "?")),
    ]
    for k, v in rows:
        out.append("| %s | %s |" % (k, str(v).replace("|", "\\|")))
    prog = [p for p in r["progress"] if p.get("phase") == "soak"]
    if prog:
        # About ten samples spread over the run, the last one included.
        step = max(1, len(prog) // 10)
        picked = prog[::step]
        if picked[-1] is not prog[-1]:
            picked.append(prog[-1])
        out += ["", "Daemon while the pods run (their 8 sessions, rings and staging exports included):", "",
                "| t (s) | cycles | rate /s | fds | maps | RSS MiB | threads | sessions | exports | rings | "
                "pod restarts |",
                "|---|---|---|---|---|---|---|---|---|---|---|"]
        for p in picked:
            out.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                p.get("t"), p.get("cycles"), p.get("rate"), p.get("fds"), p.get("maps"), mib(p.get("rss_kib", 0)),
                p.get("threads"), p.get("sessions"), p.get("exports"), p.get("rings"), p.get("restarts")))
    return out


def render(paths):
    runs = sorted((parse(p) for p in paths), key=lambda r: (r.get("soak", {}).get("date", ""), r["path"]))
    out = ["Generated by `tests/soak/summarize.py` from the raw logs in `docs/soak/`: every run, oldest first, "
           "then the latest in detail.", ""]
    out += runs_table(runs)
    if runs:
        out += [""] + detail(runs[-1])
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--update", metavar="DOC", help="rewrite the marked section of DOC")
    ap.add_argument("logs", nargs="+")
    a = ap.parse_args()
    text = render(a.logs)
    if not a.update:
        sys.stdout.write(text)
        return 0
    with open(a.update, encoding="utf-8") as f:
        doc = f.read()
    if BEGIN not in doc or END not in doc:
        sys.exit("%s has no %s ... %s section" % (a.update, BEGIN, END))
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    with open(a.update, "w", encoding="utf-8") as f:
        f.write(head + BEGIN + "\n" + text + END + tail)
    return 0


if __name__ == "__main__":
    sys.exit(main())
