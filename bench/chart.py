"""Draws steps per second against concurrency as a small SVG, and prints the results table.

The input is run_all's JSON. The SVG is drawn by hand (no plotting library); the table is the
one of docs/benchmarks.md, in Markdown: ``python bench/chart.py result.json
docs/steps_per_s.svg``."""

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


def table(r: dict[str, Any]) -> str:
    def ms(key: str) -> str:
        v = r.get(key)
        return "not measured (dbos not installed)" if v is None else f"{v:.2f} ms"

    sps = r["steps_per_s"]
    rss = r["worker_rss_mb"]
    rows = [
        ("`step_ms_bare_activity`", "a workflow of no-op activities, stack's dev server",
         ms("step_ms_bare_activity")),
        ("`step_ms_bare_activity_default_config`", "the same on a dev server without it",
         ms("step_ms_bare_activity_default_config")),
        ("`wft_schedule_to_start_ms`", "WorkflowTaskScheduled -> Started, median",
         f"{r['wft_schedule_to_start_ms']['ours']:.1f} ms (without: "
         f"{r['wft_schedule_to_start_ms']['default']:.1f} ms)"),
        ("`step_ms_bare_local_activity`", "a workflow of no-op local activities",
         ms("step_ms_bare_local_activity")),
        ("`journal_p50_ms`", "run_step alone, in process, back to back (p99 in brackets)",
         f"{r['journal_p50_ms']:.2f} ms ({r['journal_p99_ms']:.1f} ms)"),
        *((("`journal_paced_p50_ms`", "the same, one step per bare activity's step",
            ms("journal_paced_p50_ms")),) if "journal_paced_p50_ms" in r else ()),
        ("`step_ms_activity`", "RunPlan, activity path", ms("step_ms_activity")),
        *((("`activity_vs_bare_plus_journal`", "the activity path over bare + journal, "
            "within each round beside it (median); journal back to back, paced",
            f"{r['activity_vs_bare_plus_journal']:.2f}x, "
            f"{r['activity_vs_bare_plus_journal_paced']:.2f}x"),)
          if "activity_vs_bare_plus_journal" in r else ()),
        ("`step_ms_fast`", "RunPlan, fast path",
         f"{r['step_ms_fast']:.2f} ms ({r['fast_vs_activity']:.2f}x the activity path)"),
        ("`step_ms_activity_default_config`", "RunPlan, activity path, server without it",
         f"{r['step_ms_activity_default_config']:.2f} ms (fast path: "
         f"{r['fast_vs_activity_default_config']:.2f}x)"),
        ("`step_ms_dbos`", "a DBOS workflow of no-op steps, same Postgres", ms("step_ms_dbos")),
        ("`resume_ratio_10k_vs_10`", "resume of a 10,000-step vs a 10-step task",
         f"{r['resume_ratio_10k_vs_10']:.2f}x ({r['resume_ms_10k']:.0f} vs "
         f"{r['resume_ms_10']:.0f} ms)"),
        ("`probes_on_resume`", "probes per resume (most)", str(r["probes_on_resume"])),
        ("`plan_10k_s`", "10,000 steps, fast path, through continue-as-new",
         f"{r['plan_10k_s']:.0f} s"),
        ("`worker_rss_mb`", "worker RSS at 10% / 50% / 99% of it",
         " / ".join(f"{v:.0f}" for v in rss["by_progress"].values()) + " MB"),
        ("`steps_per_s`", "fast path; 1, 4, 16 tasks on one worker; 16 on two",
         ", ".join(f"{k}: {v:.0f}" for k, v in sps.items())),
    ]
    head = f"`{r['command']}`, {r['date']}\n\n| key | what | result |\n|---|---|---|\n"
    return head + "\n".join(f"| {a} | {b} | {c} |" for a, b, c in rows) + "\n"


def main() -> None:
    src, dst = sys.argv[1], sys.argv[2]
    result = json.loads(Path(src).read_text())
    Path(dst).write_text(svg(result))
    print(table(result), end="")


if __name__ == "__main__":
    main()
