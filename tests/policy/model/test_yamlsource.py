"""Tests for sandgate.policy.model.yamlsource: YAML with positions, and errors that point at them."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandgate.policy.errors import PolicyLoadError, PolicySetError, SourceLocation
from sandgate.policy.model.tenant import BaseFile, TenantFile
from sandgate.policy.model.yamlsource import MAX_DEPTH, MAX_NODES, load_yaml, parse_yaml, validate

PROPERTY = settings(max_examples=100, deadline=None)

NESTED = """\
outer:
  inner:
    leaf: 1
  other: [a, b]
list:
  - first
  - key: value
    more: 2
"""

# --- positions -------------------------------------------------------------------------------

POSITIONS = [
    ((), (1, 1), "the document starts at its first line"),
    (("outer",), (1, 1), "a top level key is where the key is written"),
    (("outer", "inner"), (2, 3), "a nested key is where the key is written"),
    (("outer", "inner", "leaf"), (3, 5), "a key two levels down is where the key is written"),
    (("outer", "other"), (4, 3), "a key with a flow list is where the key is written"),
    (("outer", "other", 0), (4, 11), "a flow list item is where the item starts"),
    (("outer", "other", 1), (4, 14), "a later flow list item is where it starts"),
    (("list",), (5, 1), "a key with a block list is where the key is written"),
    (("list", 0), (6, 5), "a block list item is after its dash"),
    (("list", 1), (7, 5), "a mapping list item starts at its first key"),
    (("list", 1, "key"), (7, 5), "the first key of a mapping item is on the dash line"),
    (("list", 1, "more"), (8, 5), "a later key of a mapping item is on its own line"),
]


@pytest.mark.parametrize(
    ("loc", "position"),
    [c[:2] for c in POSITIONS],
    ids=[c[2] for c in POSITIONS],
)
def test_positions_of_nested_keys_and_list_items(
    loc: tuple[str | int, ...], position: tuple[int, int]
) -> None:
    doc = parse_yaml(NESTED, "f.yaml")
    assert doc.positions[loc] == position
    assert doc.locate(loc) == SourceLocation("f.yaml", *position)


def test_the_data_is_plain_values() -> None:
    doc = parse_yaml(NESTED, "f.yaml")
    assert doc.data == {
        "outer": {"inner": {"leaf": 1}, "other": ["a", "b"]},
        "list": ["first", {"key": "value", "more": 2}],
    }
    assert doc.file == "f.yaml"


LOCATE = [
    (("outer", "inner", "missing"), (2, 3), "a missing key is located at its parent"),
    (("list", 9), (5, 1), "a missing list item is located at its list"),
    (("list", 1, "more", "deeper", 0), (8, 5), "a path below a scalar is located at the scalar"),
    (("nowhere", "at", "all"), (1, 1), "an unknown path is located at the document"),
]


@pytest.mark.parametrize(
    ("loc", "position"),
    [c[:2] for c in LOCATE],
    ids=[c[2] for c in LOCATE],
)
def test_locate_falls_back_to_the_nearest_ancestor(
    loc: tuple[str | int, ...], position: tuple[int, int]
) -> None:
    assert parse_yaml(NESTED, "f.yaml").locate(loc) == SourceLocation("f.yaml", *position)


def test_an_empty_document_has_no_data_and_no_positions() -> None:
    doc = parse_yaml("# only a comment\n", "f.yaml")
    assert doc.data is None
    assert doc.positions == {}
    assert doc.locate(("x",)) == SourceLocation("f.yaml")


@PROPERTY
@given(st.lists(st.from_regex(r"k[a-z0-9_]{0,12}", fullmatch=True), min_size=1, max_size=8, unique=True))
def test_every_key_of_a_block_mapping_is_on_its_own_line(keys: list[str]) -> None:
    text = "root:\n" + "".join(f"  {k}:\n    - {i}\n" for i, k in enumerate(keys))
    doc = parse_yaml(text, "f.yaml")
    for i, key in enumerate(keys):
        assert doc.positions[("root", key)] == (2 + 2 * i, 3)
        assert doc.positions[("root", key, 0)] == (3 + 2 * i, 7)
        assert doc.data["root"][key] == [i]


def test_the_digest_is_of_the_parsed_text() -> None:
    assert parse_yaml(NESTED, "f.yaml").digest == hashlib.sha256(NESTED.encode()).hexdigest()
    assert parse_yaml(NESTED + "# more\n", "f.yaml").digest != parse_yaml(NESTED, "f.yaml").digest


# --- parse errors ------------------------------------------------------------------------------

PARSE_ERRORS = [
    ("a: 1\n\tb: 2\n", "f:2:1: invalid YAML: found character '\\t' that cannot start any token", "a tab"),
    ("a: [1, 2\n", "f:2:1: invalid YAML: expected ',' or ']', but got '<stream end>'", "an unclosed bracket"),
    ("a: {b: 1\n", "f:2:1: invalid YAML: expected ',' or '}', but got '<stream end>'", "an unclosed brace"),
    ("a: 'open\n", "f:2:1: invalid YAML: found unexpected end of stream", "an unclosed quote"),
    ("a: 1\n---\nb: 2\n", "f:2:1: invalid YAML: but found another document", "two documents"),
    ("a: *nothing\n", "f:1:4: invalid YAML: found undefined alias 'nothing'", "an undefined alias"),
    ("a:\n  b: 1\n  b: 2\n", "f:3:3: a.b: duplicate key", "a duplicate nested key"),
    ("a: 1\nc: 3\na: 2\n", "f:3:1: a: duplicate key", "a duplicate top level key"),
    ("- x: 1\n  x: 2\n", "f:2:3: 0.x: duplicate key", "a duplicate key in a list item"),
    ("null: 1\n", "f:1:1: key None must be a string", "a null key"),
    ("~: 1\n", "f:1:1: key None must be a string", "a tilde key"),
    ("? [a]\n: 1\n", "f:1:3: key ['a'] must be a string", "a list as a key"),
    ("? {a: 1}\n: 1\n", "f:1:3: key {'a': 1} must be a string", "a mapping as a key"),
    ("true: 1\n", "f:1:1: key True must be a string", "a boolean key"),
    ("no: 1\n", "f:1:1: key False must be a string", "a yaml 1.1 boolean key"),
    ("1.5: x\n", "f:1:1: key 1.5 must be a string", "a float key"),
    ("a:\n  b:\n    null: 1\n", "f:3:5: a.b: key None must be a string", "a null key two levels down"),
    ("- x: 1\n  true: 2\n", "f:2:3: 0: key True must be a string", "a boolean key in a list item"),
    ("a: &x [*x]\n", "f:1:4: a.0: an alias refers to itself", "a list that contains itself"),
    ("a: &x {b: *x}\n", "f:1:4: a.b: an alias refers to itself", "a mapping that contains itself"),
    (
        "a: &x\n  - b: [1, *x]\n",
        "f:1:4: a.0.b.1: an alias refers to itself",
        "a list that contains itself two levels down",
    ),
]


@pytest.mark.parametrize(
    ("text", "message"),
    [c[:2] for c in PARSE_ERRORS],
    ids=[f"{c[2]} is reported with its position" for c in PARSE_ERRORS],
)
def test_parse_errors(text: str, message: str) -> None:
    with pytest.raises(PolicyLoadError) as info:
        parse_yaml(text, "f")
    assert str(info.value) == message


def test_integer_keys_are_kept() -> None:
    doc = parse_yaml("1: a\n2: b\n", "f")
    assert doc.data == {1: "a", 2: "b"}
    assert doc.positions[(2,)] == (2, 1)


def test_an_alias_used_twice_is_not_a_cycle() -> None:
    doc = parse_yaml("a: &x [1, 2]\nb: *x\nc: [*x, *x]\n", "f")
    assert doc.data == {"a": [1, 2], "b": [1, 2], "c": [[1, 2], [1, 2]]}
    assert doc.positions[("b",)] == (2, 1)
    assert doc.positions[("c", 1, 0)] == (1, 8), "an aliased value is where it was written"


def billion_laughs(levels: int) -> str:
    """Ten values, then `levels` lists of ten aliases to the list before: 10 ** (levels + 1) values."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_with_a_position() -> None:
    text = billion_laughs(8)
    assert len(text) < 1000
    with pytest.raises(PolicyLoadError) as info:
        parse_yaml(text, "f")
    assert type(info.value) is PolicyLoadError
    assert info.value.problem == f"more than {MAX_NODES} values (alias bomb?)"
    assert str(info.value) == f"f:1:34: a5.0.6.8.8.8.8: more than {MAX_NODES} values (alias bomb?)"


def test_many_shared_values_below_the_limit_load() -> None:
    doc = parse_yaml(billion_laughs(3), "f")
    assert len(doc.data["a3"]) == 10
    assert doc.data["a3"][9][9][9] == ["x"] * 10


def test_load_yaml_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    path.write_text(NESTED)
    doc = load_yaml(path)
    assert (doc.file, doc.data["outer"]["inner"]["leaf"]) == (str(path), 1)


@pytest.mark.parametrize(
    "content",
    [None, b"a: \xff\n"],
    ids=["a missing file cannot be read", "a file that is not utf-8 cannot be read"],
)
def test_load_yaml_reports_unreadable_files(tmp_path: Path, content: bytes | None) -> None:
    path = tmp_path / "x.yaml"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(PolicyLoadError) as info:
        load_yaml(path)
    assert info.value.location == SourceLocation(str(path))
    assert info.value.problem.startswith("cannot read: ")


# --- validation errors -------------------------------------------------------------------------

VALIDATION = [
    ("tenant: t\nalow: []\n", "f:2:1: alow: unknown key (did you mean 'allow'?)", "a misspelt top level key"),
    (
        "tenant: t\nallow:\n  - hots: [a.example.com]\n",
        "f:3:5: allow.0.hots: unknown key (did you mean 'hosts'?)",
        "a misspelt key in a rule",
    ),
    (
        "tenant: t\nsandboxes:\n  - id: s\n    tokn: env:X\n",
        "f:4:5: sandboxes.0.tokn: unknown key (did you mean 'token'?)",
        "a misspelt key in a sandbox",
    ),
    (
        "tenant: t\nlimits:\n  request_body_byte: 1\n",
        "f:3:3: limits.request_body_byte: unknown key (did you mean 'request_body_bytes'?)",
        "a misspelt key in limits",
    ),
    (
        "tenant: t\nallow:\n  - hosts: [a.example.com]\n    zzzzzz: 1\n",
        "f:4:5: allow.0.zzzzzz: unknown key "
        "(expected one of: cidrs, comment, graphql, hosts, id, inspect, jsonrpc, mcp, methods, paths, ports, protocol, websocket)",
        "an unknown key unlike any field",
    ),
    ("mode: enforce\n", "f:1:1: tenant: required field is missing", "a missing required field"),
    ("", "f: tenant: required field is missing", "an empty file"),
    (
        "tenant: t\nallow:\n  - hosts: [a.example.com]\n    ports:\n      - 443\n      - 70000\n",
        "f:6:9: allow.0.ports.1: Input should be less than or equal to 65535",
        "a port out of range",
    ),
    ("tenant: t\nmode: audit\n", "f:2:1: mode: Input should be 'enforce' or 'report'", "an unknown mode"),
    (
        "tenant: t\nallow:\n  - ports: [443]\n",
        "f:3:5: allow.0: a rule needs 'hosts' or 'cidrs'",
        "a rule without hosts",
    ),
    (
        "tenant: t\ninclude: web\n",
        "f:2:1: include: Input should be a valid list",
        "a scalar where a list belongs",
    ),
    (
        "tenant: t\nallow:\n  - hosts: [a.example.com]\n    methods: [get]\n",
        "f:4:15: allow.0.methods.0: 'get' is not an upper-case HTTP method",
        "a lower case method",
    ),
    (
        "tenant: t\nallow:\n  - hosts: [a.example.com]\n    paths: [v1/**]\n",
        "f:4:13: allow.0.paths.0: 'v1/**': a path glob starts with '/' and has no spaces",
        "a path glob without a slash",
    ),
    (
        "tenant: t\nallow:\n  - hosts: [a.example.com]\n    methods: [GET, HEAD, post]\n",
        "f:4:26: allow.0.methods.2: 'post' is not an upper-case HTTP method",
        "a bad method after good ones",
    ),
    (
        "tenant: t\nallow:\n  - hosts: [a.example.com]\n    paths:\n      - /v1/**\n      - /v2 x\n",
        "f:6:9: allow.0.paths.1: '/v2 x': a path glob starts with '/' and has no spaces",
        "a path glob with a space in a block list",
    ),
    (
        "tenant: t\nallow:\n  - hosts: [a.example.com, b.example.com, '*.*.example.com']\n",
        "f:3:43: allow.0.hosts.2: '*.*.example.com': a wildcard is only allowed as a leading '*.'",
        "a bad host after good ones",
    ),
    (
        "tenant: t\ndeny:\n  - cidrs: [10.0.0.0/8, 10.1.2.3/16]\n",
        "f:3:25: deny.0.cidrs.1: '10.1.2.3/16' has host bits set; use 10.1.0.0/16 instead",
        "a bad network after a good one",
    ),
    (
        "tenant: t\nallow:\n  - hosts: [a.example.com]\n    ports: []\n",
        "f:4:5: allow.0.ports: List should have at least 1 item after validation, not 0",
        "an empty ports list",
    ),
    (
        "tenant: t\nallow:\n  - hosts: [a.example.com]\n    methods: []\n",
        "f:4:5: allow.0.methods: List should have at least 1 item after validation, not 0",
        "an empty methods list",
    ),
    (
        "tenant: t\nallow:\n  - hosts: [a.example.com]\n    paths: []\n",
        "f:4:5: allow.0.paths: List should have at least 1 item after validation, not 0",
        "an empty paths list",
    ),
]

ADDRESS_HOSTS = [
    ("10.0.0.1", "10.0.0.1/32", "an ipv4 address"),
    ("169.254.169.254", "169.254.169.254/32", "the metadata address"),
    ("'::1'", "::1/128", "an ipv6 address"),
    ("'[::1]'", "::1/128", "a bracketed ipv6 address"),
    ("'2001:DB8::1'", "2001:db8::1/128", "an upper case ipv6 address"),
    ("0x7f.1", "127.0.0.1/32", "a hex and short form ipv4 address"),
    ("'2130706433'", "127.0.0.1/32", "a decimal ipv4 address"),
    ("'::ffff:10.0.0.1'", "::ffff:10.0.0.1/128", "an ipv4 mapped ipv6 address"),
]


@pytest.mark.parametrize(
    ("kind", "host", "network"),
    [
        pytest.param(
            kind,
            host,
            network,
            id=f"{why} in the hosts of {kind} rule is refused with the cidr to use",
        )
        for kind in ("an allow", "a deny")
        for host, network, why in ADDRESS_HOSTS
    ],
)
def test_an_address_in_hosts_is_refused(kind: str, host: str, network: str) -> None:
    key = kind.split()[-1]
    text = f"tenant: t\n{key}:\n  - hosts: [a.example.com, {host}]\n"
    with pytest.raises(PolicyLoadError) as info:
        validate(TenantFile, parse_yaml(text, "f"))
    assert type(info.value) is PolicyLoadError
    assert info.value.field == f"{key}.0.hosts.1"
    assert info.value.location == SourceLocation("f", 3, 28)
    assert info.value.problem == f"{host.strip(chr(39))!r} is an address: use cidrs: [{network}] instead"


@pytest.mark.parametrize(
    ("text", "message"),
    [c[:2] for c in VALIDATION],
    ids=[f"{c[2]} is reported with its position" for c in VALIDATION],
)
def test_validation_errors(text: str, message: str) -> None:
    with pytest.raises(PolicyLoadError) as info:
        validate(TenantFile, parse_yaml(text, "f"))
    assert str(info.value) == message


def test_a_single_error_is_a_plain_load_error() -> None:
    with pytest.raises(PolicyLoadError) as info:
        validate(TenantFile, parse_yaml("tenant: t\nmode: audit\n", "f"))
    assert type(info.value) is PolicyLoadError


def test_every_error_of_a_file_is_reported() -> None:
    text = (
        "tenant: T\n"
        "alow: []\n"
        "allow:\n"
        "  - hosts: ['*.', 10.0.0.1, ok.example.com]\n"
        "    ports: [0]\n"
        "  - cidrs: [10.0.0.1/8]\n"
        "    methods: [get]\n"
        "sandboxes:\n"
        "  - tokn: env:X\n"
    )
    with pytest.raises(PolicySetError) as info:
        validate(TenantFile, parse_yaml(text, "f"))
    assert sorted(str(e) for e in info.value.errors) == sorted(
        [
            "f:1:1: tenant: String should match pattern '^[a-z0-9](?:[a-z0-9._-]{0,62})$'",
            "f:2:1: alow: unknown key (did you mean 'allow'?)",
            "f:4:13: allow.0.hosts.0: '*.' would match every host; name the hosts to allow",
            "f:4:19: allow.0.hosts.1: '10.0.0.1' is an address: use cidrs: [10.0.0.1/32] instead",
            "f:5:13: allow.0.ports.0: Input should be greater than or equal to 1",
            "f:6:13: allow.1.cidrs.0: '10.0.0.1/8' has host bits set; use 10.0.0.0/8 instead",
            "f:7:15: allow.1.methods.0: 'get' is not an upper-case HTTP method",
            "f:9:5: sandboxes.0.id: required field is missing",
            "f:9:5: sandboxes.0.tokn: unknown key (did you mean 'token'?)",
        ]
    )
    assert str(info.value).splitlines() == [str(e) for e in info.value.errors]
    assert all(type(e) is PolicyLoadError for e in info.value.errors)


def test_a_valid_document_becomes_its_model() -> None:
    base = validate(BaseFile, parse_yaml("deny:\n  - hosts: ['*.internal']\n", "f"))
    assert base.deny[0].hosts == ["*.internal"]
    assert validate(BaseFile, parse_yaml("", "f")) == BaseFile()


# --- error values ------------------------------------------------------------------------------

LOCATIONS = [
    (SourceLocation("f.yaml"), "f.yaml", "a location without a line is the file"),
    (SourceLocation("f.yaml", 3), "f.yaml:3", "a location without a column is file and line"),
    (SourceLocation("f.yaml", 3, 7), "f.yaml:3:7", "a full location is file, line and column"),
]


@pytest.mark.parametrize(
    ("location", "text"),
    [c[:2] for c in LOCATIONS],
    ids=[c[2] for c in LOCATIONS],
)
def test_source_location_text(location: SourceLocation, text: str) -> None:
    assert str(location) == text


def test_a_load_error_renders_field_and_problem() -> None:
    assert str(PolicyLoadError(SourceLocation("f", 1, 2), "a.b", "bad")) == "f:1:2: a.b: bad"
    assert str(PolicyLoadError(SourceLocation("f", 1, 2), "", "bad")) == "f:1:2: bad"


def test_a_set_error_needs_at_least_one_error() -> None:
    with pytest.raises(ValueError, match="at least one error"):
        PolicySetError([])


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("allow: " + "[" * 5000 + "]" * 5000, 1, "invalid YAML: exceeded maximum nesting depth"),
        ("allow: " + "[" * 900 + "]" * 900, 1, f"nested deeper than {MAX_DEPTH} levels"),
        (
            "data:\n" + "".join(" " * (i + 1) + "b:\n" for i in range(950)),
            65,
            f"nested deeper than {MAX_DEPTH} levels",
        ),
    ],
    ids=[
        "flow nesting past libyaml's own cap is an error with a position, not a RecursionError",
        "flow nesting under libyaml's cap but too deep for a policy is refused where it goes too deep",
        "block nesting too deep for a policy is refused where it goes too deep",
    ],
)
def test_deep_nesting_is_a_load_error_with_a_line(text: str, line: int, message: str) -> None:
    with pytest.raises(PolicyLoadError) as info:
        parse_yaml(text, "t.yaml")
    assert info.value.location.file == "t.yaml"
    assert info.value.location.line == line
    assert message in str(info.value)
