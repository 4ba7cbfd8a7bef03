#!/usr/bin/env python3
"""Draws the trace of one merged forward/backward call as an SVG timeline.

    draw-timeline.py TRACE.csv OUT.svg

TRACE.csv is what `bench_merged --trace FILE` writes (bench/bench_merged.c): a '#' comment line (the
title), the header 'thread,name,start_us,end_us', then one row per profiler range. Thread 0 is the
caller's thread, which runs the backward half; thread 1 is the layer's thread, which runs the forward
half. Ranges nest per thread (moe.merged.backward > moe.experts.backward_data > moe.merged.wait).

One lane per thread; inside a lane each nesting depth is a row (the outermost range on top), coloured
by family. A hatched grey "wait" is a half waiting for an exchange it started: the exchange is in
flight and the turn is handed over to the other half. Standard library only.
"""
import csv
import sys
from xml.sax.saxutils import escape

# (family, legend text, fill); a range's family is the first whose test matches its name
FAMILIES = [
    ("wait", "wait: exchange in flight, turn handed over", "url(#hatch)"),
    ("weights", "weight gradients", "#e6a23c"),
    ("router", "router", "#9b6dd6"),
    ("exchange", "dispatch / combine (all-to-all)", "#4c9be8"),
    ("experts", "expert and shared-expert GEMMs", "#5cb85c"),
    ("half", "merged call's half", "#d9d9d9"),
    ("other", "other", "#bbbbbb"),
]
LANE_NAMES = {0: "backward half (caller's thread)", 1: "forward half (layer's thread)"}
LEFT, RIGHT, TOP, ROW, LANE_GAP, PLOT_W = 230, 30, 50, 20, 16, 900


def family(name):
    if "wait" in name:
        return "wait"
    if "weights" in name:
        return "weights"
    if "router" in name:
        return "router"
    if "dispatch" in name or "combine" in name:
        return "exchange"
    if "experts" in name or "shared" in name:
        return "experts"
    if "merged" in name:
        return "half"
    return "other"


def read_trace(path):
    """Returns (title, ranges) with ranges = [(thread, name, start_us, end_us)], duplicates dropped."""
    with open(path, newline="") as f:
        lines = f.read().splitlines()
    title = ""
    if lines and lines[0].startswith("#"):
        title = lines.pop(0).lstrip("#").strip()
    ranges = []
    for row in csv.DictReader(lines):
        r = (int(row["thread"]), row["name"].strip(), float(row["start_us"]), float(row["end_us"]))
        if r not in ranges:
            ranges.append(r)
    if not ranges:
        sys.exit(f"draw-timeline: {path} holds no ranges")
    return title, ranges


def depths(ranges):
    """Nesting depth of every range: how many other ranges of its thread contain it."""
    out = []
    for i, (th, _, s, e) in enumerate(ranges):
        out.append(sum(1 for j, (th2, _, s2, e2) in enumerate(ranges)
                       if j != i and th2 == th and s2 <= s and e <= e2 and (s2, e2) != (s, e)))
    return out


def nice_step(span, ticks=10):
    """A 1, 2 or 5 times a power of ten step giving about `ticks` ticks over span."""
    raw, p = span / ticks, 1.0
    while p * 10 <= raw:
        p *= 10
    while p > raw:
        p /= 10
    return next(p * m for m in (1, 2, 5, 10) if p * m >= raw)


def draw(title, ranges, out_path):
    depth = depths(ranges)
    threads = sorted({r[0] for r in ranges})
    t0 = min(0.0, min(r[2] for r in ranges)) / 1e3
    t1 = max(r[3] for r in ranges) / 1e3
    step = nice_step(t1 - t0)
    t1 = step * -(-t1 // step)  # the axis ends at a tick
    x = lambda ms: LEFT + (ms - t0) / (t1 - t0 or 1) * PLOT_W  # noqa: E731 (ms -> pixels)

    svg, y = [], TOP
    lane_top = {}
    for th in threads:
        rows = 1 + max(d for r, d in zip(ranges, depth) if r[0] == th)
        lane_top[th] = (y, rows)
        y += rows * ROW + LANE_GAP
    axis_y = y
    width, height = LEFT + PLOT_W + RIGHT, axis_y + 40 + 20 * len(FAMILIES)

    svg.append(f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
               f'font-family="sans-serif" font-size="11">')
    svg.append('<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
               'patternTransform="rotate(45)"><rect width="6" height="6" fill="#eeeeee"/>'
               '<line x1="0" y1="0" x2="0" y2="6" stroke="#999999" stroke-width="2"/></pattern></defs>')
    svg.append(f'<rect width="{width}" height="{height}" fill="white"/>')
    svg.append(f'<text x="{width / 2}" y="24" text-anchor="middle" font-size="13" '
               f'font-weight="bold">{escape(title or "merged forward/backward trace")}</text>')

    # lanes: background, label, then the ranges (outer first, so inner ones are drawn on top)
    for th in threads:
        top, rows = lane_top[th]
        svg.append(f'<rect x="{LEFT}" y="{top - 2}" width="{PLOT_W}" height="{rows * ROW + 4}" '
                   f'fill="#f7f7f7" stroke="#dddddd"/>')
        svg.append(f'<text x="{LEFT - 10}" y="{top + rows * ROW / 2 + 4}" text-anchor="end" '
                   f'font-weight="bold">{escape(LANE_NAMES.get(th, f"thread {th}"))}</text>')
    # time axis in ms, its grid behind the ranges
    svg.append(f'<line x1="{LEFT}" y1="{axis_y}" x2="{LEFT + PLOT_W}" y2="{axis_y}" stroke="black"/>')
    svg.append(f'<text x="{LEFT - 10}" y="{axis_y + 16}" text-anchor="end">time (ms)</text>')
    for k in range(int(-(-t0 // step)), int(t1 // step + 1e-9) + 1):
        px = x(k * step)
        svg.append(f'<line x1="{px:.1f}" y1="{TOP - 4}" x2="{px:.1f}" y2="{axis_y + 4}" stroke="#cccccc" '
                   f'stroke-dasharray="2,3"/>')
        svg.append(f'<text x="{px:.1f}" y="{axis_y + 16}" text-anchor="middle">{k * step:g}</text>')
    fills = {name: fill for name, _, fill in FAMILIES}
    for (th, name, s, e), d in sorted(zip(ranges, depth), key=lambda rd: rd[1]):
        top = lane_top[th][0] + d * ROW
        x0, x1 = x(s / 1e3), x(e / 1e3)
        fam = family(name)
        tip = f"{name}: {s / 1e3:.3f} - {e / 1e3:.3f} ms ({(e - s) / 1e3:.3f} ms)"
        svg.append(f'<rect x="{x0:.1f}" y="{top + 1}" width="{max(x1 - x0, 0.5):.1f}" height="{ROW - 2}" '
                   f'fill="{fills[fam]}" stroke="#555555" stroke-width="0.5"><title>{escape(tip)}</title></rect>')
        label = name[4:] if name.startswith("moe.") else name
        if x1 - x0 > 6.5 * len(label):  # only where the name fits
            svg.append(f'<text x="{(x0 + x1) / 2:.1f}" y="{top + ROW / 2 + 4}" text-anchor="middle" '
                       f'fill="#222222">{escape(label)}</text>')


    # legend: the families present in this trace
    ly = axis_y + 36
    present = {family(r[1]) for r in ranges}
    for name, text, fill in FAMILIES:
        if name not in present:
            continue
        svg.append(f'<rect x="{LEFT}" y="{ly - 10}" width="24" height="12" fill="{fill}" stroke="#555555" '
                   f'stroke-width="0.5"/>')
        svg.append(f'<text x="{LEFT + 32}" y="{ly}">{escape(text)}</text>')
        ly += 20
    svg.append("</svg>")
    # the legend may hold fewer entries than FAMILIES: shrink the picture to what was drawn
    svg[0] = svg[0].replace(f'height="{height}"', f'height="{ly}"', 1)
    svg[2] = svg[2].replace(f'height="{height}"', f'height="{ly}"', 1)
    with open(out_path, "w") as f:
        f.write("\n".join(svg) + "\n")


def main(argv):
    if len(argv) != 3:
        sys.exit("usage: draw-timeline.py TRACE.csv OUT.svg")
    title, ranges = read_trace(argv[1])
    draw(title, ranges, argv[2])


if __name__ == "__main__":
    main(sys.argv)
