"""bench/flamegraph.py draws py-spy's collapsed stacks: widths follow the samples, narrow frames
are left out, colours say whose code a frame is, and the file is well-formed SVG."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "flamegraph.py"
SVG = "{http://www.w3.org/2000/svg}"

STACKS = "\n".join(
    [
        "run (asyncio/runners.py:160);handle_event (mitmproxy/proxy/layer.py:131) 600",
        "run (asyncio/runners.py:160);requestheaders (proxy/addons/request_gate.py:61) 300",
        "run (asyncio/runners.py:160);recv (OpenSSL/SSL.py:2343) 99",
        "run (asyncio/runners.py:160);tiny <b>&</b> (proxy/x.py:1) 1",
        "not a stack line",
    ]
)


def _draw(tmp_path: Path, *extra: str) -> dict[str, tuple[float, str]]:
    raw, out = tmp_path / "stacks.raw", tmp_path / "out.svg"
    raw.write_text(STACKS)
    subprocess.run(
        [sys.executable, str(SCRIPT), str(raw), str(out), "--title", "t", *extra],
        check=True,
        timeout=60,
    )
    frames: dict[str, tuple[float, str]] = {}
    for g in ET.parse(out).getroot().iter(f"{SVG}g"):
        title, rect = g.find(f"{SVG}title"), g.find(f"{SVG}rect")
        if title is not None and rect is not None and title.text:
            frames[title.text.split(":")[0]] = (float(rect.get("width", "0")), rect.get("fill", ""))
    return frames


def test_widths_follow_the_samples_and_colours_the_owner(tmp_path: Path) -> None:
    frames = _draw(tmp_path)
    total = frames["all"][0]
    assert total == 1600  # the root spans the picture
    mitm = frames["handle_event (mitmproxy/proxy/layer.py"]
    gate = frames["requestheaders (proxy/addons/request_gate.py"]
    assert abs(mitm[0] / total - 0.6) < 0.01
    assert abs(gate[0] / total - 0.3) < 0.01
    assert frames["run (asyncio/runners.py"][0] == total
    assert mitm[1] != gate[1]  # mitmproxy and sandgate in different colours
    assert frames["recv (OpenSSL/SSL.py"][1] not in (mitm[1], gate[1])


def test_frames_under_the_minimum_width_are_left_out(tmp_path: Path) -> None:
    assert "tiny <b>&</b> (proxy/x.py" in _draw(tmp_path, "--min-width", "0.05")  # escaped, parsed back
    frames = _draw(tmp_path, "--min-width", "1")
    assert "tiny <b>&</b> (proxy/x.py" not in frames
    assert "recv (OpenSSL/SSL.py" in frames  # 9.9 %
