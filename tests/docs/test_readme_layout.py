"""The README is the front door: short, its Layout tree names every package and nothing that is
gone, and every link it has leads to a file of the repository (the manual's own links are
checked by its strict build, tests/docs/test_site_builds.py)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def layout_block() -> str:
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Layout\n") :]
    start = section.index("```text\n") + len("```text\n")
    return section[start : section.index("\n```", start)]


def listed_packages() -> set[str]:
    """`top/` lines and the `sub/` lines indented under them (at any depth), as paths."""
    found: set[str] = set()
    parents: list[tuple[int, str]] = []  # (indent, name) of the folders the next line may be in
    for line in layout_block().splitlines():
        m = re.match(r"^(\s*)(\w+)/\s", line)
        if not m:
            continue
        indent = len(m.group(1))
        while parents and parents[-1][0] >= indent:
            parents.pop()
        parents.append((indent, m.group(2)))
        found.add("/".join(name for _, name in parents))
    return found


def source_packages() -> set[str]:
    return {
        str(init.parent.relative_to(REPO))
        for top in ("policy", "brokers", "proxy")
        for init in (REPO / top).rglob("__init__.py")
    }


def test_every_package_is_in_the_layout_tree() -> None:
    assert source_packages() - listed_packages() == set()


def test_the_layout_tree_names_no_package_that_is_gone() -> None:
    listed = {p for p in listed_packages() if "/" in p}
    packages = {p for p in listed if p.split("/")[0] in ("policy", "brokers", "proxy")}
    assert packages - source_packages() == set()
    # Other folders it names (tests/e2e) are folders that exist.
    assert {p for p in listed - packages if not (REPO / p).is_dir()} == set()


FRONT_DOOR_LINES = 300


def test_the_readme_is_a_front_door_not_the_manual() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= FRONT_DOOR_LINES, "the manual lives in docs/: move the new text there"


def test_every_readme_link_leads_to_a_file_and_heading() -> None:
    text = (REPO / "README.md").read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert any(link.startswith("docs/") for link in links), "the README maps into docs/"
    broken = []
    for link in links:
        if re.match(r"^[a-z]+:", link):
            broken.append(f"{link}: the front door links only into the repository")
            continue
        path, _, anchor = link.partition("#")
        target = REPO / path if path else REPO / "README.md"
        if not target.is_file():
            broken.append(f"{link}: no such file")
        elif anchor and anchor not in _anchors(target.read_text()):
            broken.append(f"{link}: no heading #{anchor} in {path or 'README.md'}")
    assert broken == []


def _anchors(markdown: str) -> set[str]:
    """Heading ids as the manual's builder and the forge make them (explicit `{#id}` too)."""
    found = set()
    for line in markdown.splitlines():
        m = re.match(r"^#{1,6} (.*?)(?:\s*\{#([\w-]+)\})?\s*$", line)
        if m:
            found.add(m[2] or re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", m[1]).strip().lower()))
    return found
