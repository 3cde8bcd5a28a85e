"""The ceiling file: what it accepts, and errors that name file:line:column and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandgate.policy.ceiling import load_ceiling
from sandgate.policy.errors import PolicyLoadError, PolicySetError

REPO = Path(__file__).resolve().parents[3]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "ceiling.yaml"
    path.write_text(text)
    return path


def test_a_ceiling_loads_with_origins_ranges_and_always_human(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "description: test\n"
        "regions:\n"
        "  - id: web\n"
        "    hosts: [a.com, '*.b.com']\n"
        "    ports: [443, '8000-8999']\n"
        "    methods: [GET]\n"
        "    paths: ['/v1/**']\n"
        "  - cidrs: [10.0.0.0/8]\n"
        "always_human:\n"
        "  - hosts: [api.github.com]\n",
    )
    ceiling = load_ceiling(path)
    web, net = ceiling.regions
    assert web.rule_id == "ceiling/regions/web" and web.origin == f"{path}:3"
    assert web.ports.spans == ((443, 443), (8000, 8999))
    assert web.methods == frozenset({"GET"}) and web.paths == ("/v1/**",)
    assert net.rule_id == "ceiling/regions/1" and net.ports.spans == ((1, 65535),) and net.paths is None
    (human,) = ceiling.always_human
    assert human.hosts == ("api.github.com",) and human.origin == f"{path}:10"


def test_the_example_ceiling_loads() -> None:
    ceiling = load_ceiling(REPO / "rules" / "ceiling.example.yaml")
    assert ceiling.regions and ceiling.always_human


ERRORS = {
    "an unknown key, with a suggestion": (
        "regions:\n  - hosts: [a.com]\n    port: [443]\n",
        ":3:5: regions.0.port: unknown key (did you mean 'ports'?)",
    ),
    "a host not in normal form": (
        "regions:\n  - hosts: [A.com]\n",
        ":2:13: regions.0.hosts.0: 'A.com' is not in normal form: use 'a.com' instead",
    ),
    "a port range upside down": (
        "regions:\n  - hosts: [a.com]\n    ports: ['9-1']\n",
        ":3:13: regions.0.ports.0: '9-1': a range needs 1 <= low <= high <= 65535",
    ),
    "a port out of range": (
        "regions:\n  - hosts: [a.com]\n    ports: [70000]\n",
        ":3:13: regions.0.ports.0: port 70000 is out of range 1..65535",
    ),
    "a region naming nothing": (
        "regions:\n  - ports: [443]\n",
        ":2:5: regions.0: a region needs 'hosts' or 'cidrs'",
    ),
    "a network with host bits": (
        "always_human:\n  - cidrs: [10.0.0.1/8]\n",
        ":2:13: always_human.0.cidrs.0: '10.0.0.1/8' has host bits set; use 10.0.0.0/8 instead",
    ),
    "a path glob that never matches": (
        "regions:\n  - hosts: [a.com]\n    paths: ['/a//b']\n",
        ":3:13: regions.0.paths.0: '/a//b': an ambiguous path",
    ),
}


@pytest.mark.parametrize(("text", "expected"), list(ERRORS.values()), ids=list(ERRORS))
def test_errors_name_the_place(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(PolicyLoadError) as info:
        load_ceiling(path)
    errors = info.value.errors if isinstance(info.value, PolicySetError) else (info.value,)
    assert any(str(e).startswith(f"{path}{expected}") for e in errors), [str(e) for e in errors]


def test_invalid_yaml_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "regions:\n  - hosts: [a.com\n")
    with pytest.raises(PolicyLoadError, match=rf"^{path}:3:\d+: invalid YAML"):
        load_ceiling(path)
