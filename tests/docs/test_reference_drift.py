"""The generated references in docs/reference/ are what the code gives today.

docs/tools/reference.py writes them from the pydantic models (policy files, gateway config),
the argparse tree and the reason codes; `--check` compares instead of writing. Run here in a
fresh interpreter with an environment that would change the pages if they depended on it (a
$SANDGATE_HOME, a narrow terminal), so a page that passes is the same on any machine.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import pytest
from conftest import REPO
from pydantic import BaseModel, ConfigDict, Field

GENERATOR = REPO / "docs" / "tools" / "reference.py"
COMMAND = ".venv/bin/python docs/tools/reference.py"
PAGES = ("policy-file.md", "gateway-config.md", "cli.md", "reason-codes.md")


def generate(*args: str) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
        "SANDGATE_HOME": "/elsewhere/state",
        "SANDGATE_WORKERS": "7",
        "COLUMNS": "37",
    }
    return subprocess.run(
        [sys.executable, str(GENERATOR), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=env,
    )


@pytest.fixture
def tools(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The generator's modules importable here (docs/tools/ is a folder of scripts), and gone
    again afterwards: their names are generic."""
    monkeypatch.syspath_prepend(str(GENERATOR.parent))
    yield
    for path in GENERATOR.parent.glob("*.py"):
        sys.modules.pop(path.stem, None)


def test_the_committed_references_match_the_code() -> None:
    result = generate("--check")
    assert result.returncode == 0, (
        f"docs/reference/ no longer matches the code; run `{COMMAND}` and commit the result.\n"
        f"{result.stdout}{result.stderr}"
    )
    assert sorted(p.name for p in (REPO / "docs" / "reference").glob("*.md")) == sorted(
        [*PAGES, "index.md", "admin-api.md", "ocsf.md"]  # the last three written by hand
    )


def test_a_page_that_drifted_fails_with_its_diff_and_the_command(
    tmp_path: Path, tools: None, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in PAGES:
        (tmp_path / name).write_text((REPO / "docs" / "reference" / name).read_text())
    page = tmp_path / "gateway-config.md"
    page.write_text(page.read_text().replace("| `8080` |", "| `8081` |", 1))
    reference = importlib.import_module("reference")
    assert reference.main(["--check", "--out", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "-| `port` | integer 0–65535 | `8081` |" in out
    assert "+| `port` | integer 0–65535 | `8080` |" in out
    assert f"gateway-config.md no longer match the code: run `{COMMAND}`" in out
    # --check writes nothing; without it the page is written again.
    assert "`8081`" in page.read_text()
    assert reference.main(["--out", str(tmp_path)]) == 0
    assert reference.main(["--check", "--out", str(tmp_path)]) == 0


# --- the model renderer, on a model of its own ------------------------------------------------


class _Inner(BaseModel):
    """Where <tenant> goes."""

    model_config = ConfigDict(extra="forbid")

    size: Annotated[int, Field(ge=1, le=8)] = 4


class _Outer(BaseModel):
    """The root."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z]+$", description="a '*.suffix' or '*'")
    # Read from the environment: the page shows the default without it.
    home: str = Field(default_factory=lambda: os.environ.get("SANDGATE_HOME") or "~/.sandgate")
    inner: _Inner = Field(default_factory=_Inner)
    inners: list[_Inner] = Field(default_factory=lambda: [_Inner(size=2)])
    mode: str = "off"
    hidden: int = Field(default=0, exclude=True)


def test_a_model_page_shows_types_defaults_and_descriptions(
    tools: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    model_reference = importlib.import_module("model_reference")
    monkeypatch.setenv("SANDGATE_HOME", "/elsewhere")
    page = model_reference.models_page(
        "Toy",
        "intro",
        [model_reference.Root(_Outer, "Top", "top")],
        section_title=lambda name, path: f"`{path}`",
        section_anchor=lambda name, path: path.replace("[]", ""),
        sub_level=2,
        show_where=False,
    )
    rows = [line for line in page.splitlines() if line.startswith("| `")]
    assert rows == [
        "| `name` | string matching `^[a-z]+$` | required | a '\\*.suffix' or '\\*' |",
        "| `home` | string | `~/.sandgate` | Read from the environment: the page shows the default without it. |",
        "| `inner` | [`inner`](#inner) | its defaults | Where &lt;tenant> goes. |",
        "| `inners` | list of [`inner`](#inner) | `[{size: 2}]` | Where &lt;tenant> goes. |",
        '| `mode` | string | `"off"` |  |',
        "| `size` | integer 1–8 | `4` |  |",
    ]
    assert "## `inner` {#inner}\n\nWhere &lt;tenant> goes." in page
    assert os.environ["SANDGATE_HOME"] == "/elsewhere"  # the factory ran without it, then it was back
