"""Small inline SVG charts of a member's (or a group's) last hour: messages landed per 5
minutes as bars, the sampled backlog as a line over them (``history.py``). Plain SVG, no
script: a page of 256 members stays light."""

from __future__ import annotations

from airflow_provider_cg.ui.history import BUCKETS, WINDOW_S

WIDTH, HEIGHT = 180, 34


def _fmt(n: float) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}k" if n >= 1e4 else f"{n:.0f}"


def last_hour_svg(history: dict, now: float, *, width: int = WIDTH, height: int = HEIGHT, css_class: str = "spark") -> str:
    """The chart; its ``<title>`` says the same in words (and in a browser's tooltip)."""
    landed = list(history.get("landed_per_5min") or [0] * BUCKETS)
    backlog = [(float(t), int(n)) for t, n in history.get("backlog") or []]
    top = max(landed) or 1
    bar_w = width / BUCKETS
    parts = [f'<svg class="{css_class}" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
             f'role="img" xmlns="http://www.w3.org/2000/svg">']
    now_backlog = backlog[-1][1] if backlog else None
    words = (f"landed {_fmt(sum(landed))} messages in the last hour (at most {_fmt(max(landed))} per 5 min); "
             + (f"backlog now {_fmt(now_backlog or 0)}, at most {_fmt(max(n for _, n in backlog))} in "
                f"{len(backlog)} samples" if backlog else "no backlog samples yet"))
    parts.append(f"<title>{words}</title>")
    for i, n in enumerate(landed):
        if n:
            h = max(1.0, (height - 2) * n / top)
            parts.append(f'<rect class="landed" x="{i * bar_w + 0.5:.1f}" y="{height - h:.1f}" '
                         f'width="{bar_w - 1:.1f}" height="{h:.1f}" fill="#90cdf4"/>')
    if backlog:
        peak = max(n for _, n in backlog) or 1
        pts = " ".join(f"{width * (1 - min(WINDOW_S, max(0.0, now - t)) / WINDOW_S):.1f},"
                       f"{height - 1 - (height - 2) * n / peak:.1f}" for t, n in backlog)
        if len(backlog) == 1:  # one sample: a short stroke ending at it, so it shows at the edge
            x, y = (float(v) for v in pts.split(","))
            parts.append(f'<polyline class="backlog" points="{max(0.0, x - 6):.1f},{y:.1f} {x:.1f},{y:.1f}" '
                         f'fill="none" stroke="#c53030" stroke-width="2"/>')
        else:
            parts.append(f'<polyline class="backlog" points="{pts}" fill="none" stroke="#c53030" '
                         f'stroke-width="1.2"/>')
    parts.append("</svg>")
    return "".join(parts)
