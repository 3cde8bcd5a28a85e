"""Render collapsed stacks (py-spy's `--format raw`: `frame;frame;...;leaf count` per line) into a
flame graph SVG, with no dependency beyond the standard library.

Run: `.venv/bin/python bench/flamegraph.py STACKS.raw OUT.svg [--title T] [--min-width 0.1]`.
bench/profile.py `--svg DIR` calls `render` on the stacks it records.

Root at the bottom, callers below callees, width proportional to samples; frames narrower than
`--min-width` % of all samples are left out (they are unreadable and make the file large).
Colours say whose code a frame is: orange mitmproxy, blue sandgate, green the standard library,
grey third-party. Hovering a frame shows its full name, samples and share (an SVG `<title>`).
"""

from __future__ import annotations

import argparse
import html
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*):(?P<line>\d+)\)$")
WIDTH = 1600
ROW = 16
FONT = 11
_SANDGATE_ROOTS = {"sandgate", "proxy", "policy", "brokers"}
_MITM_ROOTS = {"mitmproxy", "mitmproxy_rs"}


def category(path: str) -> str:
    """mitmproxy, sandgate, stdlib or other (third-party) for a frame's file name.

    py-spy prints file names relative to the sys.path entry they were found under.
    """
    root = path.split("/", 1)[0].removesuffix(".py")
    if root in _MITM_ROOTS or "/mitmproxy/" in path:
        return "mitmproxy"
    if root in _SANDGATE_ROOTS or path.startswith(str(REPO)):
        return "sandgate"
    if root.startswith("<") or root in sys.stdlib_module_names or "/lib/python3" in path:
        return "stdlib"
    return "other"


def short(frame: str) -> str:
    """`func (file:line)` with the file name cut to the package-relative part."""
    m = FRAME.match(frame)
    if not m:
        return frame
    path = m["file"]
    for marker in ("site-packages/", "/lib/python3", str(REPO) + "/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            if marker == "/lib/python3":
                path = path.split("/", 1)[1] if "/" in path else path
            break
    return f"{m['func']} ({path}:{m['line']})"


COLOURS = {"mitmproxy": "#f4a261", "sandgate": "#6fa8dc", "stdlib": "#93c47d", "other": "#b7b7b7"}


@dataclass
class Node:
    name: str
    count: int = 0
    children: dict[str, Node] = field(default_factory=dict)


def build(text: str) -> Node:
    """The call tree of the collapsed stacks; the root's count is every sample."""
    root = Node("all")
    for line in text.splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not stack or not count_s.isdigit():
            continue
        count = int(count_s)
        root.count += count
        node = root
        for frame in stack.split(";"):
            node = node.children.setdefault(frame, Node(frame))
            node.count += count
    return root


def _colour(name: str) -> str:
    m = FRAME.match(name)
    return COLOURS[category(m["file"])] if m else COLOURS["other"]


def _label(name: str, width: float) -> str:
    text = short(name)
    fits = int(width / (FONT * 0.6))
    if fits < 3:
        return ""
    return text if len(text) <= fits else text[: fits - 2] + ".."


def _rects(root: Node, min_samples: float, depth_of: int) -> list[str]:
    """One `<g>` per frame wide enough, laid out depth-first, left to right."""
    out: list[str] = []
    scale = WIDTH / root.count
    todo: list[tuple[Node, float, int]] = [(root, 0.0, 0)]
    while todo:
        node, x, depth = todo.pop()
        w = node.count * scale
        y = (depth_of - depth) * ROW
        share = 100 * node.count / root.count
        tip = html.escape(f"{short(node.name)}: {node.count} samples, {share:.1f} %")
        label = html.escape(_label(node.name, w))
        out.append(
            f'<g><title>{tip}</title><rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{ROW - 1}" '
            f'fill="{_colour(node.name)}"/>'
            + (f'<text x="{x + 3:.1f}" y="{y + ROW - 4}">{label}</text>' if label else "")
            + "</g>"
        )
        cx = x
        for child in sorted(node.children.values(), key=lambda n: n.name):
            if child.count >= min_samples:
                todo.append((child, cx, depth + 1))
            cx += child.count * scale
    return out


def _depth(node: Node, min_samples: float) -> int:
    kids = [c for c in node.children.values() if c.count >= min_samples]
    return 1 + max((_depth(c, min_samples) for c in kids), default=0)


def render(text: str, title: str = "", min_width_pct: float = 0.1) -> str:
    """The SVG of the collapsed stacks in `text` (an empty graph when there are none)."""
    root = build(text)
    if not root.count:
        return f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="40"><text y="20">no samples</text></svg>\n'
    min_samples = root.count * min_width_pct / 100
    depth = _depth(root, min_samples)
    head = 3 * ROW
    height = head + depth * ROW
    legend = "  ".join(f"{k}: {v}" for k, v in COLOURS.items())
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'font-family="monospace" font-size="{FONT}">',
        f'<text x="4" y="{ROW}" font-size="{FONT + 3}">{html.escape(title)} ({root.count} samples)</text>',
        f'<text x="4" y="{2 * ROW}">{html.escape(legend)}; frames under {min_width_pct} % left out</text>',
        f'<g transform="translate(0,{head - ROW})">',
        *_rects(root, min_samples, depth),
        "</g></svg>",
    ]
    return "\n".join(parts) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("stacks", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--title", default="")
    p.add_argument("--min-width", type=float, default=0.1, help="leave out frames under this %% of samples")
    a = p.parse_args()
    a.out.write_text(render(a.stacks.read_text(), a.title, a.min_width))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
