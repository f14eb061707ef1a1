#!/usr/bin/env python3
"""Turns posenc-loadgen JSON files into a markdown report and PNG plots.

Usage: loadtest-report.py OUT_DIR RESULT.json...   (plots need matplotlib)

For every closed-loop concurrency sweep: a table of posenc against the echo
baseline with the ratios the targets are stated in, and plots of throughput
and p99 latency against concurrency.
"""
import json
import pathlib
import sys


def load(paths):
    runs = []
    for p in paths:
        for r in json.loads(pathlib.Path(p).read_text())["runs"]:
            r["file"] = pathlib.Path(p).stem
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


def table(rows):
    by_point = {}
    for r in rows:
        by_point.setdefault(load_point(r), {})[r["target"]] = r
    lines = ["| load | posenc req/s | echo req/s | throughput ratio | posenc p50 us | echo p50 us "
             "| p50 ratio | posenc p99 us | echo p99 us | errors |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for point in sorted(by_point):
        p, e = by_point[point].get("posenc"), by_point[point].get("echo")
        if not p or not e:
            continue
        errors = ", ".join(f"{k}={v}" for k, v in p["errors"].items()) or "none"
        if p["check_failures"]:
            errors += f", CHECK_FAILED={p['check_failures']}"
        lines.append(
            f"| {point:g}{'/s' if p['mode'] == 'open' else ''} | {p['requests_per_s']:.0f} "
            f"| {e['requests_per_s']:.0f} | {p['requests_per_s'] / e['requests_per_s']:.2f}x "
            f"| {p['latency_us']['p50']:.0f} | {e['latency_us']['p50']:.0f} "
            f"| {p['latency_us']['p50'] / e['latency_us']['p50']:.2f}x "
            f"| {p['latency_us']['p99']:.0f} | {e['latency_us']['p99']:.0f} | {errors} |")
    return "\n".join(lines)


def plot(rows, title, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for target, style in (("posenc", "o-"), ("echo", "s--")):
        pts = sorted((load_point(r), r) for r in rows if r["target"] == target)
        xs = [x for x, _ in pts]
        a.plot(xs, [r["requests_per_s"] for _, r in pts], style, label=target)
        b.plot(xs, [r["latency_us"]["p99"] / 1000 for _, r in pts], style, label=target)
    for ax, ylabel in ((a, "requests / s"), (b, "p99 latency (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency (callers)")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main():
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    sections = []
    for (name, ops, api, mode), rows in groups(load(sys.argv[2:])).items():
        title = f"{ops} - {api} - {mode} loop"
        sections.append(f"### {title}\n\n{table(rows)}\n")
        if mode == "closed":
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
