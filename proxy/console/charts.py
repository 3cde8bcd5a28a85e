"""Charts as SVG text built on the server: no chart library, nothing inline for the CSP to
refuse (presentation attributes and CSS classes only). Every label is XML-escaped."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

__all__ = ["column_chart", "row_chart"]

WIDTH = 640
ROW_HEIGHT = 22
LABEL_WIDTH = 240


def _text(value: object) -> str:
    return escape(str(value), quote=True)


def column_chart(
    series: Sequence[tuple[str, Sequence[float]]], *, title: str, unit: str, start: str, height: int = 160
) -> str:
    """Stacked columns, one per time bucket from `start` (its label) to now: `series` is
    (CSS class, values) bottom first."""
    count = max((len(values) for _, values in series), default=0)
    totals = [sum(values[i] for _, values in series if i < len(values)) for i in range(count)]
    top = max(totals, default=0) or 1
    width = WIDTH / max(count, 1)
    parts = [
        f'<svg class="chart" role="img" aria-label="{_text(title)}" viewBox="0 0 {WIDTH} {height + 20}" '
        f'width="{WIDTH}" height="{height + 20}" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{_text(title)}</title>",
    ]
    for i in range(count):
        base = float(height)
        for css, values in series:
            value = values[i] if i < len(values) else 0
            bar = height * value / top
            if bar > 0:
                parts.append(
                    f'<rect class="{_text(css)}" x="{i * width:.1f}" y="{base - bar:.1f}" '
                    f'width="{max(width - 1, 1):.1f}" height="{bar:.1f}"/>'
                )
                base -= bar
    parts.append(f'<line class="axis" x1="0" y1="{height}" x2="{WIDTH}" y2="{height}"/>')
    parts.append(f'<text class="label" x="0" y="{height + 15}">{_text(start)}</text>')
    parts.append(
        f'<text class="label" x="{WIDTH / 2:.0f}" y="{height + 15}" text-anchor="middle">'
        f"peak {top:.2f} {_text(unit)}</text>"
    )
    parts.append(f'<text class="label" x="{WIDTH}" y="{height + 15}" text-anchor="end">now</text>')
    parts.append("</svg>")
    return "".join(parts)


def row_chart(rows: Sequence[tuple[str, int]], *, title: str, css: str = "deny") -> str:
    """Horizontal bars with their label and count, in the order given."""
    if not rows:
        return f'<p class="empty">{_text(title)}: none in this window</p>'
    top = max(count for _, count in rows) or 1
    height = ROW_HEIGHT * len(rows)
    span = WIDTH - LABEL_WIDTH - 60
    parts = [
        f'<svg class="chart" role="img" aria-label="{_text(title)}" viewBox="0 0 {WIDTH} {height}" '
        f'width="{WIDTH}" height="{height}" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{_text(title)}</title>",
    ]
    for i, (label, count) in enumerate(rows):
        y = i * ROW_HEIGHT
        bar = max(span * count / top, 1)
        shown = label if len(label) <= 36 else label[:35] + "…"
        parts.append(f'<text class="label" x="0" y="{y + 15}">{_text(shown)}</text>')
        parts.append(
            f'<rect class="{_text(css)}" x="{LABEL_WIDTH}" y="{y + 4}" '
            f'width="{bar:.1f}" height="{ROW_HEIGHT - 8}"/>'
        )
        parts.append(f'<text class="label" x="{LABEL_WIDTH + bar + 6:.1f}" y="{y + 15}">{count}</text>')
    parts.append("</svg>")
    return "".join(parts)
