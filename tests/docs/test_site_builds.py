"""The manual builds as a static site: `mkdocs build --strict`, with every link, anchor and nav
entry checked (mkdocs.yml's `validation:`), offline, and nothing in it fetched from the web."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import REPO

MKDOCS = Path(sys.executable).with_name("mkdocs")


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
        "NO_MKDOCS_2_WARNING": "1",  # MkDocs' banner about its next major version
    }
    return subprocess.run(
        [str(MKDOCS), "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_the_manual_builds_in_strict_mode_without_a_warning(tmp_path: Path) -> None:
    result = build(REPO / "mkdocs.yml", tmp_path / "site")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert not re.search(r"^(WARNING|ERROR)", output, re.MULTILINE), output
    assert (tmp_path / "site" / "reference" / "gateway-config" / "index.html").is_file()
    assert not (tmp_path / "site" / "tools").exists()  # the generator is not published
    # Nothing a page loads comes from the network: no web fonts, no remote script or style.
    remote = re.compile(r"""<(?:link|script|img)\b[^>]*\b(?:href|src)=["']?(?:https?:)?//""")
    for page in (tmp_path / "site").rglob("*.html"):
        assert not remote.search(page.read_text()), page


def test_a_link_to_a_missing_page_or_anchor_fails_the_build(tmp_path: Path) -> None:
    shutil.copytree(REPO / "docs", tmp_path / "docs", ignore=shutil.ignore_patterns("tools", "__pycache__"))
    shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    index = tmp_path / "docs" / "index.md"
    index.write_text(
        index.read_text() + "\nSee [x](concepts/nowhere.md) and [y](reference/cli.md#sandgate-fly).\n"
    )
    result = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "link 'concepts/nowhere.md', but the target is not found" in output
    assert "does not contain an anchor '#sandgate-fly'" in output
    assert "Aborted with 2 warnings in strict mode!" in output
