"""Draws steps per second against concurrency from run_all's JSON as a small SVG, by hand (no
plotting library): ``python bench/chart.py result.json docs/steps_per_s.svg``."""

from __future__ import annotations

import json
import sys
from html import escape
from pathlib import Path
from typing import Any

WIDTH, HEIGHT = 560, 320
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 40, 66


def label(key: str) -> tuple[str, str]:
    """("16 tasks", "2 workers") for "16x2"; one worker unless the key says otherwise."""
    tasks, _, workers = key.partition("x")
    return (f"{tasks} task{'s' if tasks != '1' else ''}",
            f"{workers or 1} worker{'s' if workers not in ('', '1') else ''}")


def svg(result: dict[str, Any]) -> str:
    data = [(label(k), float(v)) for k, v in result["steps_per_s"].items()]
    top = max(v for _, v in data)
    scale = 10 ** (len(str(int(top))) - 1)
    ymax = (int(top / scale) + 1) * scale
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = plot_w / len(data)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
           f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">',
           f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
           f'<text x="{WIDTH / 2}" y="20" text-anchor="middle" font-size="14">'
           f'Fast-path steps per second against concurrent tasks</text>']
    for i in range(5):  # grid lines and y labels
        v = ymax * i / 4
        y = TOP + plot_h - plot_h * i / 4
        out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" '
                   f'stroke="#ddd"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{v:.0f}</text>')
    for i, (name, v) in enumerate(data):
        h = plot_h * v / ymax
        x = LEFT + i * slot + slot * 0.2
        y = TOP + plot_h - h
        out.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{slot * 0.6:.1f}" height="{h:.1f}" '
                   f'fill="#3b6ea8"/>')
        out.append(f'<text x="{x + slot * 0.3:.1f}" y="{y - 5:.1f}" text-anchor="middle">'
                   f'{v:.0f}</text>')
        for line, text in enumerate(name):
            out.append(f'<text x="{x + slot * 0.3:.1f}" y="{TOP + plot_h + 16 + 14 * line}" '
                       f'text-anchor="middle">{escape(text)}</text>')
    out.append(f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{WIDTH - RIGHT}" '
               f'y2="{TOP + plot_h}" stroke="black"/>')
    out.append(f'<text x="16" y="{TOP + plot_h / 2}" text-anchor="middle" '
               f'transform="rotate(-90 16 {TOP + plot_h / 2})">steps per second</text>')
    note = f"{result.get('machine', '')}; {result.get('date', '')}"
    out.append(f'<text x="{WIDTH / 2}" y="{HEIGHT - 12}" text-anchor="middle" fill="#555" '
               f'font-size="10">{escape(note)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main() -> None:
    src, dst = sys.argv[1], sys.argv[2]
    Path(dst).write_text(svg(json.loads(Path(src).read_text())))


if __name__ == "__main__":
    main()
