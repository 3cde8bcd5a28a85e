"""Tests for sandgate.policy.matcher: rule indexes, reasons, path globs and inspection."""

from __future__ import annotations

from collections.abc import Iterable
from ipaddress import IPv4Address, IPv6Address, ip_address

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandgate.policy.matcher import (
    ANY_PORT,
    UNPARSEABLE_PATH,
    CompiledRule,
    RuleIndex,
    compile_path_globs,
)
from sandgate.policy.reasons import Reason

PROPERTY = settings(max_examples=100, deadline=None)
R = Reason


def rule(
    rule_id: str,
    *,
    hosts: Iterable[str] = (),
    cidrs: Iterable[str] = (),
    ports: Iterable[int] = (443,),
    methods: Iterable[str] | None = None,
    paths: Iterable[str] | None = None,
    inspect: bool = False,
    cls: type[CompiledRule] = CompiledRule,
) -> CompiledRule:
    """A compiled rule as the loader would build it."""
    return cls(
        rule_id=rule_id,
        ports=frozenset(ports),
        methods=frozenset(methods) if methods is not None else None,
        paths=compile_path_globs(paths) if paths is not None else None,
        inspect=inspect,
        hosts=tuple(hosts),
        cidrs=tuple(cidrs),
    )


def ip_of(host: str) -> IPv4Address | IPv6Address | None:
    """The address of an IP-literal host, as decide() passes it."""
    try:
        return ip_address(host)
    except ValueError:
        return None


def ids(index: RuleIndex, host: str) -> list[str]:
    """Rule ids of the candidates for a host."""
    return [r.rule_id for r in index.candidates(host, ip_of(host))]


# --- candidates: exact, suffix, cidr ---------------------------------------------------

HOST_MATCHES = [
    ("example.com", "example.com", True, "an exact host matches itself"),
    ("example.com", "a.example.com", False, "an exact host does not match its subdomains"),
    ("example.com", "badexample.com", False, "an exact host does not match a longer name"),
    ("*.example.com", "a.example.com", True, "a wildcard matches one label below its suffix"),
    ("*.example.com", "a.b.example.com", True, "a wildcard matches several labels below its suffix"),
    ("*.example.com", "example.com", False, "a wildcard does not match its bare suffix"),
    ("*.example.com", "badexample.com", False, "a wildcard does not match a name that only ends alike"),
    ("*.example.com", "example.com.evil.test", False, "a wildcard does not match its suffix as a prefix"),
    ("*.example.com", "a.example.co", False, "a wildcard does not match a shorter suffix"),
    ("*.b.example.com", "a.b.example.com", True, "a deeper wildcard matches below it"),
    ("*.b.example.com", "b.example.com", False, "a deeper wildcard does not match its own suffix"),
    ("*.b.example.com", "a.c.example.com", False, "a deeper wildcard does not match a sibling"),
]


@pytest.mark.parametrize(
    ("pattern", "host", "matches"),
    [c[:3] for c in HOST_MATCHES],
    ids=[c[3] for c in HOST_MATCHES],
)
def test_host_patterns(pattern: str, host: str, matches: bool) -> None:
    index = RuleIndex([rule("r", hosts=[pattern])])
    assert ids(index, host) == (["r"] if matches else [])


CIDR_MATCHES = [
    ("10.1.2.0/24", "10.1.2.3", True, "an address inside a network matches"),
    ("10.1.2.0/24", "10.1.3.1", False, "an address outside a network does not match"),
    ("10.1.2.0/24", "::ffff:10.1.2.3", True, "the ipv4-mapped spelling of a covered address matches"),
    ("2001:db8::/32", "2001:db8::1", True, "an ipv6 address inside an ipv6 network matches"),
    ("2001:db8::/32", "2001:db9::1", False, "an ipv6 address outside an ipv6 network does not match"),
]


@pytest.mark.parametrize(
    ("network", "address", "matches"),
    [c[:3] for c in CIDR_MATCHES],
    ids=[c[3] for c in CIDR_MATCHES],
)
def test_cidr_rules(network: str, address: str, matches: bool) -> None:
    index = RuleIndex([rule("r", cidrs=[network])])
    assert ids(index, address) == (["r"] if matches else [])


def test_a_name_never_matches_a_network_rule() -> None:
    index = RuleIndex([rule("net", cidrs=["10.0.0.0/8"]), rule("name", hosts=["10.example.com"])])
    assert ids(index, "10.example.com") == ["name"]


def test_candidates_come_exact_first_then_suffixes_from_longest() -> None:
    index = RuleIndex(
        [
            rule("short", hosts=["*.example.com"]),
            rule("long", hosts=["*.b.example.com"]),
            rule("exact", hosts=["a.b.example.com"]),
        ]
    )
    assert ids(index, "a.b.example.com") == ["exact", "long", "short"]


def test_a_rule_naming_several_hosts_is_found_by_each() -> None:
    index = RuleIndex([rule("r", hosts=["a.example.com", "*.example.org"])])
    assert ids(index, "a.example.com") == ["r"]
    assert ids(index, "x.example.org") == ["r"]
    assert ids(index, "b.example.com") == []


@PROPERTY
@given(st.lists(st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True), min_size=1, max_size=4))
def test_a_wildcard_matches_any_labels_below_it(labels: list[str]) -> None:
    index = RuleIndex([rule("r", hosts=["*.example.com"])])
    host = ".".join(labels)
    assert ids(index, f"{host}.example.com") == ["r"]
    assert ids(index, f"{host}example.com") == []


# --- match: reasons ----------------------------------------------------------------------

API = rule("api", hosts=["api.example.com"], ports=[443], methods=["GET", "HEAD"], paths=["/v1/**"])
ANY = rule("any", hosts=["*.example.org"], ports=[])

MATCHES = [
    ("api.example.com", 443, "GET", "/v1/users", R.ALLOWED, "api", "a request meeting every part is allowed"),
    ("api.example.com", 443, None, None, R.ALLOWED, "api", "at connect method and path are not known yet"),
    ("api.example.com", 443, "HEAD", None, R.ALLOWED, "api", "an unknown path is not held against a rule"),
    ("api.example.com", 8443, "GET", "/v1/x", R.PORT_NOT_ALLOWED, "api", "a port the rule omits is refused"),
    (
        "api.example.com",
        443,
        "POST",
        "/v1/x",
        R.METHOD_NOT_ALLOWED,
        "api",
        "a method the rule omits is refused",
    ),
    (
        "api.example.com",
        443,
        "GET",
        "/v2/x",
        R.PATH_NOT_ALLOWED,
        "api",
        "a path outside the globs is refused",
    ),
    ("api.example.com", 443, "get", "/v1/x", R.METHOD_NOT_ALLOWED, "api", "methods are case sensitive"),
    ("other.example.com", 443, "GET", "/v1/x", R.HOST_NOT_ALLOWED, None, "an unlisted host gets no_match"),
    ("a.example.org", 1, "DELETE", "/x", R.ALLOWED, "any", "a rule without ports allows every port"),
    ("a.example.org", 65535, None, None, R.ALLOWED, "any", "a rule without ports allows the highest port"),
]


@pytest.mark.parametrize(
    ("host", "port", "method", "path", "reason", "rule_id"),
    [c[:6] for c in MATCHES],
    ids=[c[6] for c in MATCHES],
)
def test_match_reasons(
    host: str, port: int, method: str | None, path: str | None, reason: Reason, rule_id: str | None
) -> None:
    index = RuleIndex([API, ANY])
    result = index.match(host, None, port, method, path, no_match=R.HOST_NOT_ALLOWED)
    assert result.reason is reason
    got = result.rule if reason is R.ALLOWED else result.nearest
    assert (got.rule_id if got else None) == rule_id
    assert (result.rule is None) == (reason is not R.ALLOWED)


def test_match_returns_the_no_match_reason_it_is_given() -> None:
    result = RuleIndex([]).match("a.example.com", None, 443, None, None, no_match=R.HOST_DENIED)
    assert result.reason is R.HOST_DENIED
    assert result.rule is None and result.nearest is None


PORT_ONLY = rule("port-8443", hosts=["h.example.com"], ports=[8443])
METHOD_ONLY = rule("get-only", hosts=["h.example.com"], methods=["GET"])
PATH_ONLY = rule("v1-only", hosts=["h.example.com"], methods=["POST"], paths=["/v1/*"])

PRECEDENCE = [
    ([PORT_ONLY, METHOD_ONLY], R.METHOD_NOT_ALLOWED, "get-only", "a method failure beats a port failure"),
    ([METHOD_ONLY, PORT_ONLY], R.METHOD_NOT_ALLOWED, "get-only", "a port failure after it does not demote"),
    (
        [PORT_ONLY, METHOD_ONLY, PATH_ONLY],
        R.PATH_NOT_ALLOWED,
        "v1-only",
        "a path failure beats method and port failures",
    ),
    (
        [PATH_ONLY, METHOD_ONLY, PORT_ONLY],
        R.PATH_NOT_ALLOWED,
        "v1-only",
        "later method and port failures do not demote a path failure",
    ),
    ([PORT_ONLY], R.PORT_NOT_ALLOWED, "port-8443", "a port failure alone is reported as such"),
]


@pytest.mark.parametrize(
    ("rules", "reason", "nearest"),
    [c[:3] for c in PRECEDENCE],
    ids=[c[3] for c in PRECEDENCE],
)
def test_the_most_specific_failure_is_reported(
    rules: list[CompiledRule], reason: Reason, nearest: str
) -> None:
    result = RuleIndex(rules).match("h.example.com", None, 443, "POST", "/v2/x", no_match=R.HOST_NOT_ALLOWED)
    assert result.reason is reason
    assert result.rule is None
    assert result.nearest is not None and result.nearest.rule_id == nearest


def test_a_later_rule_that_matches_wins_over_earlier_failures() -> None:
    index = RuleIndex([PORT_ONLY, METHOD_ONLY, rule("post", hosts=["*.example.com"], methods=["POST"])])
    result = index.match("h.example.com", None, 443, "POST", "/v2/x", no_match=R.HOST_NOT_ALLOWED)
    assert result.reason is R.ALLOWED
    assert result.rule is not None and result.rule.rule_id == "post"


def test_a_network_rule_matches_an_address_with_its_port() -> None:
    index = RuleIndex([rule("lab", cidrs=["10.1.2.0/24"], ports=[22])])
    ok = index.match("10.1.2.3", ip_address("10.1.2.3"), 22, None, None, no_match=R.HOST_NOT_ALLOWED)
    port = index.match("10.1.2.3", ip_address("10.1.2.3"), 443, None, None, no_match=R.HOST_NOT_ALLOWED)
    miss = index.match("10.9.9.9", ip_address("10.9.9.9"), 22, None, None, no_match=R.HOST_NOT_ALLOWED)
    assert (ok.reason, port.reason, miss.reason) == (R.ALLOWED, R.PORT_NOT_ALLOWED, R.HOST_NOT_ALLOWED)


# --- path globs ---------------------------------------------------------------------------

GLOBS = [
    (["/v1/*"], "/v1/users", True, "a star matches one segment"),
    (["/v1/*"], "/v1/", True, "a star matches an empty segment"),
    (["/v1/*"], "/v1/users/1", False, "a star does not cross a slash"),
    (["/v1/*"], "/v1", False, "a star needs the slash before it"),
    (["/v1/**"], "/v1/a/b/c", True, "a double star crosses slashes"),
    (["/v1/**"], "/v1/", True, "a double star matches nothing at all"),
    (["/v1/**"], "/v1", True, "a trailing double star covers the base path itself"),
    (["/admin/**"], "/adminx", False, "a covered base path is a whole segment"),
    (["/v1/**"], "/v10/a", False, "a double star after a slash does not widen the segment"),
    (["/files/*.txt"], "/files/a.txt", True, "a star inside a segment matches a prefix"),
    (["/files/*.txt"], "/files/a/b.txt", False, "a star inside a segment does not cross a slash"),
    (["/files/*.txt"], "/files/a.txt/x", False, "globs are anchored at the end"),
    (["/v1/users"], "/x/v1/users", False, "globs are anchored at the start"),
    (["/a?c"], "/abc", True, "a question mark matches one character"),
    (["/a?c"], "/a/c", False, "a question mark does not match a slash"),
    (["/v1.0/x"], "/v1x0/x", False, "a dot is literal"),
    (["/a+b/(x)"], "/a+b/(x)", True, "regex characters are literal"),
    (["/a/**/z"], "/a/b/c/z", True, "a double star in the middle spans segments"),
    (["/a/**/z"], "/a/z", True, "a double star in the middle may stand for no segment"),
    (["/a/**/z"], "/az", False, "a double star in the middle keeps one slash"),
    (["/v1/**.json"], "/v1/a/b.json", True, "a double star inside a segment crosses slashes"),
    (["/v1/*:run"], "/v1/x%3Arun", True, "a colon in a glob matches its escape too"),
    (["/a@b!c"], "/a%40b%21c", True, "sub-delimiters in a glob match their escapes too"),
    (["/a:b"], "/a%3Bb", False, "a colon does not match another escape"),
    (["/v1/**"], "/V1/x", False, "allow globs do not fold case"),
    (["/v1/**", "/health"], "/health", True, "any of several globs may match"),
    (["/v1/**", "/health"], "/healthz", False, "several globs are each anchored"),
    (["/**"], UNPARSEABLE_PATH, False, "even the widest glob does not match an unparseable path"),
]


@pytest.mark.parametrize(
    ("globs", "path", "matches"),
    [c[:3] for c in GLOBS],
    ids=[c[3] for c in GLOBS],
)
def test_path_globs(globs: list[str], path: str, matches: bool) -> None:
    assert (compile_path_globs(globs).fullmatch(path) is not None) is matches


FOLDED = [
    (["/admin/**"], "/ADMIN/x", True, "an upper case path hits a lower case deny glob"),
    (["/admin/**"], "/Admin", True, "a mixed case base path hits a deny glob for its subtree"),
    (["/a/%C3%A4"], "/A/%c3%a4", True, "escapes fold too"),
    (["/admin/**"], "/admins", False, "folding does not widen a segment"),
]


@pytest.mark.parametrize(
    ("globs", "path", "matches"),
    [c[:3] for c in FOLDED],
    ids=[c[3] for c in FOLDED],
)
def test_deny_globs_fold_case(globs: list[str], path: str, matches: bool) -> None:
    assert (compile_path_globs(globs, fold_case=True).fullmatch(path) is not None) is matches


@PROPERTY
@given(st.text(alphabet=st.characters(codec="ascii", exclude_characters="/\x00"), max_size=20))
def test_a_star_matches_any_one_segment(segment: str) -> None:
    assert compile_path_globs(["/v1/*/x"]).fullmatch(f"/v1/{segment}/x") is not None
    assert compile_path_globs(["/v1/*/x"]).fullmatch(f"/v1/{segment}/y/x") is None


# --- unparseable paths --------------------------------------------------------------------


def test_an_unparseable_path_matches_no_allow_glob() -> None:
    index = RuleIndex([rule("r", hosts=["a.example.com"], paths=["/**", "/*", "/?*"])])
    result = index.match("a.example.com", None, 443, "GET", UNPARSEABLE_PATH, no_match=R.HOST_NOT_ALLOWED)
    assert result.reason is R.PATH_NOT_ALLOWED


def test_an_allow_rule_without_paths_does_not_look_at_the_path() -> None:
    index = RuleIndex([rule("r", hosts=["a.example.com"])])
    result = index.match("a.example.com", None, 443, "GET", UNPARSEABLE_PATH, no_match=R.HOST_NOT_ALLOWED)
    assert result.reason is R.ALLOWED


@pytest.mark.parametrize(
    "globs",
    [["/admin/**"], ["/nothing-like-it"], ["/a?c"]],
    ids=[
        "an unparseable path hits a deny glob for a subtree",
        "an unparseable path hits a deny glob it could never spell",
        "an unparseable path hits a deny glob with a question mark",
    ],
)
def test_an_unparseable_path_hits_every_deny_glob(globs: list[str]) -> None:
    index = RuleIndex([rule("d", hosts=["a.example.com"], ports=[], paths=globs)])
    hit = index.deny_match("a.example.com", None, 443, "GET", UNPARSEABLE_PATH)
    assert hit is not None and hit.rule_id == "d"


# --- deny_match ---------------------------------------------------------------------------

DENY_POST = rule("no-post", hosts=["*.example.com"], ports=[], methods=["POST"])
DENY_ADMIN = rule("no-admin", hosts=["*.example.com"], ports=[], paths=["/admin/**"])
DENY_HOST = rule("no-host", hosts=["blocked.example.com"], ports=ANY_PORT)
DENY_PORT = rule("no-25", hosts=["*.example.com"], ports=[25])

DENIES = [
    ("a.example.com", 443, None, None, None, "a method deny rule is skipped at connect"),
    ("a.example.com", 443, "POST", "/x", "no-post", "a method deny rule hits its method"),
    ("a.example.com", 443, "GET", "/x", None, "a method deny rule lets other methods pass"),
    ("a.example.com", 443, "GET", "/admin/users", "no-admin", "a path deny rule hits its subtree"),
    ("a.example.com", 443, "GET", "/public", None, "a path deny rule lets other paths pass"),
    ("a.example.com", 443, "GET", None, "no-admin", "a path deny rule hits when the path is unknown"),
    ("blocked.example.com", 443, None, None, "no-host", "a host deny rule hits at connect"),
    ("blocked.example.com", 8080, "GET", "/", "no-host", "a host deny rule without ports hits every port"),
    ("a.example.com", 25, None, None, "no-25", "a port deny rule hits its port"),
    ("a.example.com", 26, None, None, None, "a port deny rule lets other ports pass"),
    ("a.example.net", 443, "POST", "/admin/x", None, "an unrelated host is not denied"),
]


@pytest.mark.parametrize(
    ("host", "port", "method", "path", "rule_id"),
    [c[:5] for c in DENIES],
    ids=[c[5] for c in DENIES],
)
def test_deny_match(host: str, port: int, method: str | None, path: str | None, rule_id: str | None) -> None:
    index = RuleIndex([DENY_POST, DENY_ADMIN, DENY_HOST, DENY_PORT])
    hit = index.deny_match(host, None, port, method, path)
    assert (hit.rule_id if hit else None) == rule_id


def test_a_deny_network_rule_hits_an_address_literal() -> None:
    index = RuleIndex([rule("no-lab", cidrs=["10.1.0.0/16"], ports=[])])
    assert index.deny_match("10.1.2.3", ip_address("10.1.2.3"), 443, None, None) is not None
    assert index.deny_match("10.2.0.1", ip_address("10.2.0.1"), 443, None, None) is None


DENY_NET = rule("no-net", cidrs=["93.184.217.0/24"], ports=[])
DENY_NET_DB = rule("no-db", cidrs=["93.184.218.0/24"], ports=[5432])
DENY_NET_ADMIN = rule("no-admin-net", cidrs=["93.184.219.0/24"], ports=[], paths=["/admin/**"])
DENY_NAME = rule("no-name", hosts=["*.example.com"], ports=[])

DENY_ADDRESSES = [
    ("93.184.217.7", 443, None, None, "no-net", "an address in a deny network is denied"),
    ("::ffff:93.184.217.7", 443, None, None, "no-net", "the ipv4-mapped spelling is denied too"),
    ("93.184.216.7", 443, None, None, None, "an address outside every deny network passes"),
    ("93.184.218.7", 5432, None, None, "no-db", "a deny network hits its port"),
    ("93.184.218.7", 443, None, None, None, "a deny network lets other ports pass"),
    ("93.184.219.7", 443, None, None, None, "a deny network on a path is skipped at connect"),
    ("93.184.219.7", 443, "GET", "/admin/x", "no-admin-net", "a deny network on a path hits its path"),
    ("93.184.219.7", 443, "GET", "/public", None, "a deny network on a path lets other paths pass"),
]


@pytest.mark.parametrize(
    ("address", "port", "method", "path", "rule_id"),
    [c[:5] for c in DENY_ADDRESSES],
    ids=[c[5] for c in DENY_ADDRESSES],
)
def test_deny_address(
    address: str, port: int, method: str | None, path: str | None, rule_id: str | None
) -> None:
    index = RuleIndex([DENY_NAME, DENY_NET, DENY_NET_DB, DENY_NET_ADMIN])
    hit = index.deny_address(ip_address(address), port, method, path)
    assert (hit.rule_id if hit else None) == rule_id


def test_a_deny_rule_on_names_never_denies_an_address() -> None:
    index = RuleIndex([DENY_NAME])
    assert index.deny_address(ip_address("93.184.217.7"), 443, "GET", "/") is None


# --- needs_inspection and opens_internal --------------------------------------------------

INSPECTION = [
    (rule("r", hosts=["a.example.com"]), 443, False, "a host-only rule passes tls through"),
    (rule("r", hosts=["a.example.com"], inspect=True), 443, True, "an inspect rule intercepts"),
    (rule("r", hosts=["a.example.com"], paths=["/v1/**"]), 443, True, "a path rule intercepts"),
    (rule("r", hosts=["a.example.com"], methods=["GET"]), 443, True, "a method rule intercepts"),
    (rule("r", hosts=["a.example.com"], inspect=True), 8443, False, "a rule for another port is ignored"),
    (rule("r", hosts=["b.example.com"], inspect=True), 443, False, "a rule for another host is ignored"),
]


@pytest.mark.parametrize(
    ("compiled", "port", "expected"),
    [c[:3] for c in INSPECTION],
    ids=[c[3] for c in INSPECTION],
)
def test_needs_inspection(compiled: CompiledRule, port: int, expected: bool) -> None:
    assert RuleIndex([compiled]).needs_inspection("a.example.com", None, port) is expected


def test_one_inspecting_rule_among_several_is_enough() -> None:
    index = RuleIndex(
        [rule("plain", hosts=["a.example.com"]), rule("deep", hosts=["*.example.com"], inspect=True)]
    )
    assert index.needs_inspection("a.example.com", None, 443) is True


OPENS = [
    ("10.1.2.3", 443, True, "an address in an internal network rule on its port is opened"),
    ("10.1.2.3", 80, False, "an address in an internal network rule on another port is not opened"),
    ("10.1.2.3", None, True, "an address in an internal network rule on any port is opened"),
    ("10.1.3.3", 443, False, "an address outside every network rule is not opened"),
    ("::ffff:10.1.2.3", 443, True, "the ipv4-mapped spelling is opened too"),
    ("10.9.9.9", 443, False, "an address only a broad network rule covers is not opened"),
    ("fd12::1", 443, False, "an ula address only ::/0 covers is not opened"),
    ("127.0.0.1", 443, False, "loopback only 0.0.0.0/0 covers is not opened"),
]


@pytest.mark.parametrize(
    ("address", "port", "expected"),
    [c[:3] for c in OPENS],
    ids=[c[3] for c in OPENS],
)
def test_opens_internal(address: str, port: int | None, expected: bool) -> None:
    index = RuleIndex(
        [
            rule("lab", cidrs=["10.1.2.0/24"], ports=[443]),
            rule("internet", cidrs=["0.0.0.0/0", "::/0"], ports=[443]),
            rule("name", hosts=["x.example.com"]),
        ]
    )
    assert index.opens_internal(ip_address(address), port) is expected


# --- hosts: ["*"] ---------------------------------------------------------------------------

ANY_INDEX = RuleIndex(
    [
        rule("any", hosts=["*"], ports=[443]),
        rule("api", hosts=["api.example.com"], ports=[443], paths=["/v1/**"]),
        rule("net", cidrs=["93.184.216.0/24"], ports=[443]),
    ]
)

ANY_CASES = [
    ("x.example.org", None, None, "any", True, "a name no rule names matches hosts star"),
    ("api.example.com", None, None, "api", False, "a rule naming the host wins over hosts star"),
    ("api.example.com", "GET", "/v2/x", "any", True, "hosts star matches where the naming rule does not"),
    ("93.184.216.34", None, None, "net", False, "an ip literal is matched by networks, never hosts star"),
    ("93.184.217.34", None, None, None, False, "an ip literal outside every network is not matched"),
]


@pytest.mark.parametrize(
    ("host", "method", "path", "rule_id", "any_host"),
    [c[:5] for c in ANY_CASES],
    ids=[c[5] for c in ANY_CASES],
)
def test_hosts_star(
    host: str, method: str | None, path: str | None, rule_id: str | None, any_host: bool
) -> None:
    literal = ip_address(host) if host[0].isdigit() else None
    result = ANY_INDEX.match(host, literal, 443, method, path, no_match=R.HOST_NOT_ALLOWED)
    assert (result.rule.rule_id if result.rule else None, result.any_host) == (rule_id, any_host)


def test_hosts_star_names_every_host_but_explicitly_none() -> None:
    assert ANY_INDEX.names_host("anything.example.net")
    assert not ANY_INDEX.names_explicitly("anything.example.net")
    assert ANY_INDEX.names_explicitly("api.example.com")


def test_hosts_star_keeps_its_ports() -> None:
    result = ANY_INDEX.match("x.example.org", None, 80, None, None, no_match=R.HOST_NOT_ALLOWED)
    assert (result.rule, result.reason) == (None, R.PORT_NOT_ALLOWED)


def test_a_lookup_with_hosts_star_among_ten_thousand_rules_touches_only_its_own() -> None:
    touched: list[str] = []
    cls = counting_rule_class(touched)
    rules = [rule(f"r{i}", hosts=[f"h{i}.example.com"], cls=cls) for i in range(TENANTS)]
    index = RuleIndex([*rules, rule("any", hosts=["*"], cls=cls)])
    assert index.match("h77.example.com", None, 443, None, None, no_match=R.HOST_NOT_ALLOWED).rule
    assert index.match("elsewhere.example.org", None, 443, None, None, no_match=R.HOST_NOT_ALLOWED).any_host
    assert touched == ["r77", "any"]


# --- cost: lookups touch only what matches ------------------------------------------------

TENANTS = 10_000


def counting_rule_class(touched: list[str]) -> type[CompiledRule]:
    """A CompiledRule whose port check records which rules a lookup looked at."""

    class CountingRule(CompiledRule):
        def port_ok(self, port: int) -> bool:
            touched.append(self.rule_id)
            return CompiledRule.port_ok(self, port)

    return CountingRule


def test_matching_one_tenant_does_not_touch_the_others() -> None:
    touched: list[str] = []
    cls = counting_rule_class(touched)
    indexes = [
        RuleIndex(
            [
                rule(f"t{i}/exact", hosts=[f"api.t{i}.example.com"], cls=cls),
                rule(f"t{i}/wild", hosts=[f"*.t{i}.example.net"], cls=cls),
                rule(f"t{i}/net", cidrs=[f"10.{i // 256}.{i % 256}.0/24"], cls=cls),
            ]
        )
        for i in range(TENANTS)
    ]
    mine = indexes[4321]
    assert mine.match("api.t4321.example.com", None, 443, None, None, no_match=R.HOST_NOT_ALLOWED).rule
    assert mine.match("x.y.t4321.example.net", None, 443, None, None, no_match=R.HOST_NOT_ALLOWED).rule
    assert mine.match(
        "10.16.225.9", ip_address("10.16.225.9"), 443, None, None, no_match=R.HOST_NOT_ALLOWED
    ).rule
    miss = mine.match("api.t1234.example.com", None, 443, None, None, no_match=R.HOST_NOT_ALLOWED)
    assert miss.reason is R.HOST_NOT_ALLOWED
    assert touched == ["t4321/exact", "t4321/wild", "t4321/net"]


def test_a_lookup_among_ten_thousand_exact_rules_touches_only_its_own() -> None:
    touched: list[str] = []
    cls = counting_rule_class(touched)
    index = RuleIndex(rule(f"r{i}", hosts=[f"h{i}.example.com"], cls=cls) for i in range(TENANTS))
    assert ids(index, "h9876.example.com") == ["r9876"]
    assert ids(index, "h10000.example.com") == []
    result = index.match("h5.example.com", None, 443, "GET", "/", no_match=R.HOST_NOT_ALLOWED)
    assert result.rule is not None and result.rule.rule_id == "r5"
    assert index.deny_match("h6.example.com", None, 443, "GET", "/") is not None
    assert index.needs_inspection("h7.example.com", None, 443) is False
    assert touched == ["r5", "r6", "r7"]


def test_a_lookup_among_ten_thousand_wildcards_touches_only_its_suffixes() -> None:
    touched: list[str] = []
    cls = counting_rule_class(touched)
    index = RuleIndex(rule(f"w{i}", hosts=[f"*.s{i}.example.com"], cls=cls) for i in range(TENANTS))
    assert ids(index, "a.b.c.s42.example.com") == ["w42"]
    assert ids(index, "s42.example.com") == []
    index.match("deep.er.s9999.example.com", None, 443, None, None, no_match=R.HOST_NOT_ALLOWED)
    assert touched == ["w9999"]


def test_a_lookup_among_ten_thousand_networks_yields_only_covering_ones() -> None:
    index = RuleIndex(rule(f"n{i}", cidrs=[f"10.{i // 256}.{i % 256}.0/24"]) for i in range(TENANTS))
    assert ids(index, "10.39.15.1") == [f"n{39 * 256 + 15}"]
    assert ids(index, "10.200.0.1") == []
