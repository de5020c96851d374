"""Inline SVG charts of a group's or a member's last hour: messages landed per 5 minutes as
bars, the backlog samples as a line over them (``history.py``), on a time axis (UTC clock
times) with the values of both scales written out. Plain SVG, no script, colours from the
page's CSS (light and dark): a page of 256 members stays light."""

from __future__ import annotations

import time

from airflow_provider_cg.ui.history import BUCKETS, WINDOW_S

#: (width, height, left, right, bottom, top): a member's chart in its table row, a group's above its table
SMALL = (240, 58, 4, 4, 12, 11)
LARGE = (720, 158, 52, 52, 18, 16)


def fmt(n: float) -> str:
    """A count as the page writes it: 950, 12.5k, 3.2M."""
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}k" if n >= 1e4 else f"{n:,.0f}"


def clock(t: float) -> str:
    return time.strftime("%H:%M", time.gmtime(t))


def last_hour_svg(history: dict, now: float, *, large: bool = False, css_class: str = "spark") -> str:
    """The chart. Its ``<title>`` says the same in words (and in a browser's tooltip); its text
    elements carry the values: ``y-landed`` (the bars' scale: most messages landed in 5 min),
    ``y-backlog`` (the line's: the largest backlog sampled), ``x-tick`` (clock times, UTC; each
    with its moment in ``data-at``: the page's script writes it in the reader's time zone, as
    the page's other times)."""
    width, height, left, right, bottom, top = LARGE if large else SMALL
    plot_w, plot_h = width - left - right, height - top - bottom
    landed = list(history.get("landed_per_5min") or [0] * BUCKETS)
    backlog = [(float(t), int(n)) for t, n in history.get("backlog") or [] if now - float(t) <= WINDOW_S]
    bars_top = max(landed) or 1
    line_top = max((n for _, n in backlog), default=0) or 1
    now_backlog = backlog[-1][1] if backlog else None
    words = (f"landed {fmt(sum(landed))} messages in the last hour (at most {fmt(max(landed))} per 5 min); "
             + (f"backlog now {fmt(now_backlog or 0)}, at most {fmt(max(n for _, n in backlog))} in "
                f"{len(backlog)} samples" if backlog else "no backlog samples yet"))
    out = [f'<svg class="{css_class}" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
           f'role="img" aria-label="{words}" xmlns="http://www.w3.org/2000/svg"><title>{words}</title>',
           f'<rect class="plot" x="{left}" y="{top}" width="{plot_w}" height="{plot_h}"/>']

    def x_at(age: float) -> float:
        return left + plot_w * (1 - min(WINDOW_S, max(0.0, age)) / WINDOW_S)

    # the time axis: clock times at every quarter hour (large) or at its ends and middle (small)
    ticks = [WINDOW_S * k / 4 for k in range(4, -1, -1)] if large else [WINDOW_S, WINDOW_S / 2, 0.0]
    for age in ticks:
        x = x_at(age)
        anchor = "start" if age == WINDOW_S else "end" if age == 0 else "middle"
        out.append(f'<line class="grid" x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + plot_h}"/>'
                   f'<text class="x-tick" x="{x:.1f}" y="{height - 2}" text-anchor="{anchor}" '
                   f'data-at="{now - age:.0f}">{clock(now - age)}</text>')
    bar_w = plot_w / BUCKETS
    for i, n in enumerate(landed):
        if n:
            h = max(1.0, plot_h * n / bars_top)
            out.append(f'<rect class="landed" x="{left + i * bar_w + 0.5:.1f}" y="{top + plot_h - h:.1f}" '
                       f'width="{bar_w - 1:.1f}" height="{h:.1f}"><title data-at="{now - WINDOW_S + (i + 1) * 300:.0f}">'
                       f'{fmt(n)} landed in the 5 min to {clock(now - WINDOW_S + (i + 1) * 300)}</title></rect>')
    if backlog:
        pts = [(x_at(now - t), top + plot_h - plot_h * n / line_top) for t, n in backlog]
        if len(pts) == 1:  # one sample: a short stroke ending at it, so it shows at the edge
            (x, y), = pts
            pts = [(max(left, x - 6), y), (x, y)]
        out.append('<polyline class="backlog" points="' + " ".join(f"{x:.1f},{y:.1f}" for x, y in pts) + '"/>')
        x, y = pts[-1]
        out.append(f'<circle class="backlog-now" cx="{x:.1f}" cy="{y:.1f}" r="{2.5 if large else 2}"/>')
    # the two scales' tops, written: the bars' on the left, the line's on the right
    if large:  # a scale is written only when it has something to measure (no "0 to 0")
        if any(landed):
            out.append(f'<text class="y-landed" x="{left - 4}" y="{top + 9}" text-anchor="end">{fmt(bars_top)}</text>'
                       f'<text class="y-landed" x="{left - 4}" y="{top + plot_h}" text-anchor="end">0</text>')
        else:
            out.append(f'<text class="empty" x="{left + plot_w / 2:.1f}" y="{top + plot_h / 2:.1f}" '
                       'text-anchor="middle">nothing landed in the last hour</text>')
        if backlog:
            out.append(f'<text class="y-backlog" x="{left + plot_w + 4}" y="{top + 9}">{fmt(line_top)}</text>'
                       f'<text class="y-backlog" x="{left + plot_w + 4}" y="{top + plot_h}">0</text>')
        out.append(f'<text class="y-unit y-landed" x="{left}" y="{top - 3}">messages landed / 5 min</text>'
                   f'<text class="y-unit y-backlog" x="{left + plot_w}" y="{top - 3}" text-anchor="end">'
                   'backlog, messages</text>')
    else:
        out.append(f'<text class="y-landed" x="{left}" y="{top - 2}">{fmt(max(landed))}/5 min</text>'
                   f'<text class="y-backlog" x="{left + plot_w}" y="{top - 2}" text-anchor="end">'
                   f'backlog {fmt(now_backlog) if now_backlog is not None else "-"}</text>')
    out.append("</svg>")
    return "".join(out)
