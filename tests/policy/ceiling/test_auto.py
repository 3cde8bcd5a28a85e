"""Automatic approval's verdict: what a request asks for is approved without a person only
inside the ceiling, outside its always-human entries and away from credential-bound hosts."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandgate.policy.ceiling import load_ceiling
from sandgate.policy.ceiling.auto import asked_shape, needs_a_person
from sandgate.policy.ceiling.model import Ceiling

CEILING = """\
regions:
  - id: packages
    hosts: [pypi.org, "*.pythonhosted.org"]
    ports: [443]
  - id: api-read
    hosts: [api.example.com]
    ports: [443]
    methods: [GET, HEAD]
    paths: ["/v1/**"]
  - id: lab
    cidrs: [10.9.0.0/24]
    ports: [8080]
always_human:
  - hosts: [files.pythonhosted.org]
"""


@pytest.fixture
def ceiling(tmp_path: Path) -> Ceiling:
    path = tmp_path / "ceiling.yaml"
    path.write_text(CEILING)
    return load_ceiling(path)


@pytest.mark.parametrize(
    ("host", "port", "methods", "paths"),
    [
        ("pypi.org", 443, None, None),
        ("a.pythonhosted.org", 443, ["GET"], ["/simple/**"]),
        ("api.example.com", 443, ["GET"], ["/v1/repos/x"]),
        ("10.9.0.7", 8080, None, None),
    ],
    ids=["a whole host", "a wildcard's host, narrowed", "inside a region's methods and paths", "an address"],
)
def test_inside_the_ceiling_is_approved_automatically(
    ceiling: Ceiling, host: str, port: int, methods: list[str] | None, paths: list[str] | None
) -> None:
    assert needs_a_person(asked_shape(host, port, methods, paths), ceiling) is None


@pytest.mark.parametrize(
    ("host", "port", "methods", "paths", "why"),
    [
        ("evil.test", 443, None, None, "outside the ceiling"),
        ("pypi.org", 80, None, None, "outside the ceiling"),
        ("api.example.com", 443, ["POST"], ["/v1/x"], "outside the ceiling: POST"),
        ("api.example.com", 443, ["GET"], ["/v2/x"], "outside the ceiling: GET https://api.example.com/v2/x"),
        ("api.example.com", 443, None, None, "outside the ceiling"),
        ("10.9.1.7", 8080, None, None, "outside the ceiling"),
        ("files.pythonhosted.org", 443, ["GET"], ["/p"], "always_human"),
    ],
    ids=[
        "another host",
        "another port",
        "a method the region leaves out",
        "a path the region leaves out",
        "a released CONNECT asks for every method and path",
        "an address outside the network",
        "an always-human host inside a region",
    ],
)
def test_anything_else_waits_for_a_person_and_says_why(
    ceiling: Ceiling, host: str, port: int, methods: list[str] | None, paths: list[str] | None, why: str
) -> None:
    verdict = needs_a_person(asked_shape(host, port, methods, paths), ceiling)
    assert verdict is not None and why in verdict, verdict


def test_a_credentials_host_always_waits_for_a_person(ceiling: Ceiling) -> None:
    shape = asked_shape("pypi.org", 443, ["GET"], ["/simple/x"])
    assert needs_a_person(shape, ceiling, ["*.org"]) == "pypi.org is a credential's host: kept for people"
    assert needs_a_person(shape, ceiling, ["api.example.com"]) is None
