"""Draws scripts/bench-mount.sh's CSV as a bar chart: each operation's time relative to gocryptfs (1.0), and the target (0.8)."""
import csv
import sys
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the non-interactive backend)

source, target = sys.argv[1], sys.argv[2]
with open(source, newline="") as handle:
    rows = list(csv.DictReader(handle))

labels = [row["operation"] for row in rows]
series = [("plain dir", "plain_ms", "#9e9e9e"), ("gocryptfs", "gocryptfs_ms", "#f5a623"), ("sandboxctl mount", "mount_ms", "#2f6fdf")]
figure, axes = plt.subplots(figsize=(13, 5))
width = 0.26
for offset, (name, column, colour) in enumerate(series):
    values = [float(row[column]) / max(float(row["gocryptfs_ms"]), 1.0) for row in rows]
    positions = [index + (offset - 1) * width for index in range(len(rows))]
    bars = axes.bar(positions, values, width, label=name, color=colour)
    for bar, row in zip(bars, rows):
        axes.annotate(f"{float(row[column]) / 1000:.2f} s", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                      ha="center", va="bottom", fontsize=7, rotation=90, xytext=(0, 2), textcoords="offset points")
axes.axhline(1.0, color="#f5a623", linewidth=0.8, linestyle="--")
axes.axhline(0.8, color="#2f6fdf", linewidth=0.8, linestyle=":", label="target (0.8 of gocryptfs)")
axes.set_xticks(range(len(rows)))
axes.set_xticklabels([textwrap.fill(label, 22) for label in labels], fontsize=8)
axes.set_ylabel("time relative to gocryptfs (lower is faster)")
axes.set_title("sandboxctl mount vs gocryptfs vs the plain backing directory (median, same machine, one run)")
axes.legend()
axes.margins(y=0.25)
figure.tight_layout()
figure.savefig(target, dpi=120)
