#!/usr/bin/env python3
"""Turns posenc-loadgen results into a markdown report and PNG plots.

Usage: loadtest-report.py OUT_DIR RESULT.json|RESULT.csv...   (plots need matplotlib)

For every sweep (closed-loop concurrency or open-loop request rate): a table
of posenc against the echo baseline with the ratios the targets are stated
in, whether each point was stable (and, open loop, sustained), and a figure
with throughput and p99 against the load and latency (p50 and p99) against
achieved throughput. Throughput axes start at 0, so a flat line looks flat.
"""
import csv
import json
import pathlib
import sys


def from_csv(path):
    """CSV rows (posenc-loadgen --csv) in the JSON runs' shape."""
    runs = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            runs.append({
                "target": row["target"], "ops": row["ops"], "api": row["api"],
                "mode": row["mode"], "concurrency": int(row["concurrency"]),
                "rate": float(row["request_rate"]),
                "requests_per_s": float(row["achieved_per_s"]),
                "latency_us": {k: float(row[f"{k}_us"]) for k in ("p50", "p90", "p95", "p99", "max")},
                "errors": {"failed": int(row["failed"])} if int(row["failed"]) else {},
                "check_failures": int(row["check_failures"]),
                "stable": row["stable"] == "true", "sustained": row["sustained"] == "true",
            })
    return runs


def load(paths):
    runs = []
    for p in paths:
        path = pathlib.Path(p)
        rows = from_csv(path) if path.suffix == ".csv" else json.loads(path.read_text())["runs"]
        for r in rows:
            r["file"] = path.stem
            runs.append(r)
    return runs


def groups(runs):
    out = {}
    for r in runs:
        key = (r["file"], r["ops"], r["api"], r["mode"])
        out.setdefault(key, []).append(r)
    return out


def load_point(r):
    return r["rate"] if r["mode"] == "open" else r["concurrency"]


def flags(r):
    """Stability and (open loop) sustained marks; runs from before either
    was measured carry neither."""
    marks = []
    if r.get("stable") is False:
        marks.append("unstable")
    if r.get("sustained") is False:
        marks.append("not sustained")
    return ", ".join(marks)


def table(rows):
    by_point = {}
    for r in rows:
        by_point.setdefault(load_point(r), {})[r["target"]] = r
    lines = ["| load | posenc req/s | echo req/s | throughput ratio | posenc p50 us | echo p50 us "
             "| p50 ratio | posenc p95 us | posenc p99 us | echo p99 us | errors | marks |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for point in sorted(by_point):
        p, e = by_point[point].get("posenc"), by_point[point].get("echo")
        if not p or not e:
            continue
        errors = ", ".join(f"{k}={v}" for k, v in p["errors"].items()) or "none"
        if p["check_failures"]:
            errors += f", CHECK_FAILED={p['check_failures']}"
        ratio = lambda a, b: f"{a / b:.2f}x" if b else "-"
        p95 = p["latency_us"].get("p95")
        marks = "; ".join(m for m in (flags(p) and f"posenc {flags(p)}",
                                      flags(e) and f"echo {flags(e)}") if m) or "-"
        lines.append(
            f"| {point:g}{'/s' if p['mode'] == 'open' else ''} | {p['requests_per_s']:.0f} "
            f"| {e['requests_per_s']:.0f} | {ratio(p['requests_per_s'], e['requests_per_s'])} "
            f"| {p['latency_us']['p50']:.0f} | {e['latency_us']['p50']:.0f} "
            f"| {ratio(p['latency_us']['p50'], e['latency_us']['p50'])} "
            f"| {'-' if p95 is None else f'{p95:.0f}'} "
            f"| {p['latency_us']['p99']:.0f} | {e['latency_us']['p99']:.0f} | {errors} | {marks} |")
    return "\n".join(lines)


def plot(rows, title, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    open_loop = rows[0]["mode"] == "open"
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4))
    for target, color in (("posenc", "tab:blue"), ("echo", "tab:orange")):
        pts = sorted(((load_point(r), r) for r in rows if r["target"] == target),
                     key=lambda x: x[0])
        if not pts:
            continue
        xs = [x for x, _ in pts]
        rps = [r["requests_per_s"] for _, r in pts]
        a.plot(xs, rps, "o-", color=color, label=target)
        b.plot(xs, [r["latency_us"]["p99"] / 1000 for _, r in pts], "o-", color=color,
               label=target)
        # Latency against what was achieved: the curve's knee is the capacity.
        c.plot(rps, [r["latency_us"]["p50"] / 1000 for _, r in pts], "o-", color=color,
               label=f"{target} p50")
        c.plot(rps, [r["latency_us"]["p99"] / 1000 for _, r in pts], "s--", color=color,
               label=f"{target} p99")
    load_label = "request rate asked (/s)" if open_loop else "concurrency (callers)"
    for ax, xlabel, ylabel in ((a, load_label, "achieved requests / s"),
                               (b, load_label, "p99 latency (ms)"),
                               (c, "achieved requests / s", "latency (ms)")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend()
    if open_loop:
        a.set_xlim(left=0)  # asked throughput
        b.set_xlim(left=0)
    else:
        a.set_xscale("log", base=2)
        b.set_xscale("log", base=2)
    a.set_ylim(bottom=0)  # throughput
    b.set_ylim(bottom=0)
    c.set_xlim(left=0)  # throughput
    c.set_ylim(bottom=0)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    sections = []
    for (name, ops, api, mode), rows in groups(load(sys.argv[2:])).items():
        title = f"{ops} - {api} - {mode} loop"
        sections.append(f"### {title}\n\n{table(rows)}\n")
        png = f"{name}.png"
        try:
            plot(rows, title, out / png)
            sections.append(f"![{title}]({png})\n")
        except ImportError:
            pass
    (out / "tables.md").write_text("\n".join(sections))
    print(f"wrote {out / 'tables.md'}")


if __name__ == "__main__":
    main()
