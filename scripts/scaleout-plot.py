#!/usr/bin/env python3
"""Plots per-replica throughput over time across a rolling restart.

Usage: scaleout-plot.py OUT.png DIR[=TITLE]...   (needs matplotlib)

Each DIR holds calls.csv and events.csv as tests/system/scaleout_test.cc writes
them when run with POSENC_SCALEOUT_OUT=D (its rolling-restart tests write
D/rollout and D/rollout_no_health_check); one panel per DIR, top to bottom. Throughput is counted by when calls finished, in 100 ms bins; stacked by
replica; each replica's time away (SIGTERM until it serves again) is hatched
in its colour.
"""
import csv
import pathlib
import sys

BIN_S = 0.1


def read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def panel(ax, src, title, colours):
    calls = read(src / "calls.csv")
    events = read(src / "events.csv")
    end = max(float(c["start_s"]) + float(c["latency_s"]) for c in calls)
    bins = int(end / BIN_S) + 1
    replicas = sorted({int(c["replica"]) for c in calls if int(c["replica"]) >= 0})
    counts = {r: [0] * bins for r in replicas}
    failed = [0] * bins
    for c in calls:
        b = int((float(c["start_s"]) + float(c["latency_s"])) / BIN_S)
        if int(c["code"]) != 0:
            failed[b] += 1
        elif int(c["replica"]) in counts:
            counts[int(c["replica"])][b] += 1
    t = [i * BIN_S for i in range(bins)]
    ax.stackplot(t, *[[n / BIN_S for n in counts[r]] for r in replicas],
                 colors=colours[:len(replicas)], labels=[f"replica {r}" for r in replicas],
                 alpha=0.85, lw=0)
    if any(failed):
        ax.plot(t, [n / BIN_S for n in failed], color="red", lw=1.2, label="failed")
    away = {}
    for e in events:
        what, when = e["event"], float(e["t_s"])
        if what.startswith("SIGTERM "):
            away[int(what.split()[1])] = when
        elif what.startswith("restarted "):
            r = int(what.split()[1])
            ax.axvspan(away.pop(r), when, color=colours[replicas.index(r)], alpha=0.6, lw=0,
                       hatch="//", fill=False)
    ax.set_ylabel("calls/s finished")
    ax.set_title(f"{title}: {len(calls)} calls, {sum(failed)} failed", fontsize=10)
    ax.set_ylim(bottom=0)
    ax.legend(loc="lower left", fontsize=7, ncol=len(replicas) + 1)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out = sys.argv[1]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    specs = [a.split("=", 1) if "=" in a else (a, pathlib.Path(a).name) for a in sys.argv[2:]]
    fig, axes = plt.subplots(len(specs), 1, figsize=(8, 2.6 * len(specs)), dpi=80, sharex=True,
                             squeeze=False)
    for ax, (src, title) in zip(axes[:, 0], specs):
        panel(ax, pathlib.Path(src), title, colours)
    axes[-1, 0].set_xlabel("seconds; hatched: a replica draining, exited, restarting "
                           "(3 replicas, 4 closed-loop callers, 100 ms bins)")
    fig.tight_layout()
    fig.savefig(out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
