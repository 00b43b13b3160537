"""Small SVG charts for the CLI's reports (no plotting dependency for a few lines of markup)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape

COLORS = ("#4e79a7", "#e15759", "#59a14f", "#f28e2b", "#b07aa1", "#76b7b2")


def step_series(points: Sequence[tuple[float, float]], end: float, every: float) -> list[tuple[float, float]]:
    """A step signal ``(t, value)`` (each value holds until the next t) resampled every ``every``
    seconds as the bucket's maximum, so short peaks stay visible."""
    out: list[tuple[float, float]] = []
    if not points:
        return out
    i = 0
    current = points[0][1]
    t = 0.0
    while t < end:
        top = current
        while i < len(points) and points[i][0] < t + every:
            current = points[i][1]
            top = max(top, current)
            i += 1
        out.append((t, top))
        t += every
    return out


#: time units for the x axis, smallest first: (label, seconds)
_UNITS = (("seconds", 1.0), ("minutes", 60.0), ("hours", 3600.0), ("days", 86400.0))


def time_axis(span_seconds: float, max_ticks: int = 8) -> tuple[str, float, list[float]]:
    """The x axis of a ``span_seconds`` window: the largest unit that holds at least two of it,
    and ticks (in seconds) at round steps of that unit (1, 2 or 5 times a power of ten), at most
    ``max_ticks`` of them; so a 20-minute window reads 0, 5, 10, 15, 20 minutes, not 0, 0, 0 hours."""
    label, scale = next(((u, s) for u, s in reversed(_UNITS) if span_seconds / s >= 2), _UNITS[0])
    span = span_seconds / scale
    raw = span / max(max_ticks - 1, 1)
    magnitude = 10.0 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    count = int(span / step + 1e-9)
    return label, scale, [k * step * scale for k in range(count + 1)]


def round_ticks(span: float, max_ticks: int = 8, *, whole: bool = False) -> list[float]:
    """Ticks from 0 to ``span`` at a round step (1, 2 or 5 times a power of ten), at most ``max_ticks``;
    ``whole``: a step of at least 1 (an axis of counts has no run 0.2)."""
    raw = span / max(max_ticks - 1, 1)
    magnitude = 10.0 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    if whole:
        step = max(step, 1.0)
    return [k * step for k in range(int(span / step + 1e-9) + 1)]


def line_panels(
    title: str,
    panels: Sequence[tuple[str, dict[str, list[tuple[float, float]]]]],
    *,
    width: int = 900,
    panel_height: int = 180,
    markers: Sequence[tuple[int, str, list[tuple[float, float]]]] = (),
    x_label: str | None = None,
    hover: Sequence[Mapping[str, Sequence[str]]] | None = None,
) -> str:
    """Stacked panels sharing the x axis (seconds, shown in a unit that suits the window; or, with
    ``x_label``, counts such as run indexes, on whole ticks); each panel maps a series name to
    ``(x, y)`` points. ``markers``: ``(panel index, name, points)`` drawn as red crosses, named in the
    legend. ``hover``: per panel, per series, a text per point, shown when the pointer is on its dot.
    A series of one point is drawn as a dot. The drawing scales to its box (``viewBox``)."""
    left, right, top, gap = 60, 160, 40, 46
    height = top + len(panels) * (panel_height + gap) + 10
    plot_w = width - left - right
    xs = [x for _, series in panels for pts in series.values() for x, _ in pts]
    x_max = max(xs, default=1.0) or 1.0
    if x_label is not None:
        x_max = max(x_max, 2.0)  # one run sits mid-axis, not on its edge
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        'font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="22" font-size="14" font-weight="bold">{escape(title)}</text>',
    ]
    for p, (label, series) in enumerate(panels):
        y0 = top + p * (panel_height + gap)
        ys = [y for pts in series.values() for _, y in pts]
        y_max = max(ys, default=1.0) or 1.0
        out.append(f'<text x="{left}" y="{y0 + 12}" fill="#333">{escape(label)} (max {y_max:g})</text>')
        base = y0 + 18 + panel_height - 18
        out.append(f'<line x1="{left}" y1="{base}" x2="{left + plot_w}" y2="{base}" stroke="#999"/>')
        out.append(f'<line x1="{left}" y1="{y0 + 18}" x2="{left}" y2="{base}" stroke="#999"/>')
        for k in range(0, 5):
            v = y_max * k / 4
            y = base - (panel_height - 18) * k / 4
            out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#777">{v:.3g}</text>')
        for s, (name, pts) in enumerate(series.items()):
            color = COLORS[s % len(COLORS)]
            path = " ".join(
                f"{'M' if i == 0 else 'L'}{left + plot_w * x / x_max:.1f},{base - (panel_height - 18) * y / y_max:.1f}"
                for i, (x, y) in enumerate(pts)
            )
            out.append(f'<path d="{path}" fill="none" stroke="{color}" stroke-width="1.2"/>')
            titles = (hover[p] if hover is not None and p < len(hover) else {}).get(name)
            if titles is not None or len(pts) == 1:
                for i, (x, y) in enumerate(pts):
                    cx, cy = left + plot_w * x / x_max, base - (panel_height - 18) * y / y_max
                    tip = f"<title>{escape(titles[i])}</title>" if titles is not None and i < len(titles) else ""
                    out.append(f'<circle class="dot" cx="{cx:.1f}" cy="{cy:.1f}" r="3.5" fill="{color}">{tip}</circle>')
            if p == 0:
                out.append(
                    f'<rect x="{left + plot_w + 14}" y="{y0 + 20 + 16 * s}" width="10" height="10" fill="{color}"/>'
                )
                out.append(f'<text x="{left + plot_w + 28}" y="{y0 + 29 + 16 * s}">{escape(name)}</text>')
        for m, (_panel, name, pts) in enumerate(mk for mk in markers if mk[0] == p):
            for x, y in pts:
                cx, cy = left + plot_w * x / x_max, base - (panel_height - 18) * y / y_max
                out.append(
                    f'<path class="marker" d="M{cx - 5:.1f},{cy - 5:.1f}L{cx + 5:.1f},{cy + 5:.1f}'
                    f'M{cx - 5:.1f},{cy + 5:.1f}L{cx + 5:.1f},{cy - 5:.1f}" stroke="#d00" stroke-width="2"/>'
                )
            if pts:
                ly = y0 + 29 + 16 * (len(series) + m)
                out.append(f'<text x="{left + plot_w + 14}" y="{ly}" fill="#d00">x {escape(name)}</text>')
    if x_label is None:
        x_label, x_scale, ticks = time_axis(x_max)
    else:
        x_scale, ticks = 1.0, round_ticks(x_max, whole=True)
    base_x = top + len(panels) * (panel_height + gap) - gap + 14
    for x in ticks:
        out.append(
            f'<text x="{left + plot_w * x / x_max:.1f}" y="{base_x}" text-anchor="middle" fill="#777">{x / x_scale:.4g}</text>'
        )
    out.append(f'<text x="{left + plot_w / 2}" y="{base_x + 14}" text-anchor="middle" fill="#555">{x_label}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
