"""The prover on crafted rules and ceilings: joint cover, globs and networks that overlap in
non-obvious ways; every counter-example is checked with the gateway's own matcher."""

from __future__ import annotations

import string
from collections.abc import Sequence
from pathlib import Path

import pytest
from support.ceiling_oracle import gateway_allows, readable

from sandgate.policy.ceiling import (
    RAW_TCP,
    ProofTooLarge,
    RuleShape,
    excess,
    load_ceiling,
    lookup_excess,
    overlap,
    ports_of,
)
from sandgate.policy.model.tenant import Rule


def rule(
    *hosts: str,
    cidrs: Sequence[str] = (),
    ports: Sequence[int | tuple[int, int]] | None = (443,),
    methods: Sequence[str] | None = None,
    paths: Sequence[str] | None = None,
    raw_tcp: bool = False,
) -> RuleShape:
    """A tenant rule (ports default to [443], as the loader does)."""
    return RuleShape(
        hosts=hosts,
        cidrs=tuple(cidrs),
        ports=ports_of(ports),
        methods=frozenset(methods) if methods is not None else None,
        paths=tuple(paths) if paths is not None else None,
        raw_tcp=raw_tcp,
    )


def deny(
    *hosts: str,
    cidrs: Sequence[str] = (),
    ports: Sequence[int | tuple[int, int]] | None = None,
    methods: Sequence[str] | None = None,
    paths: Sequence[str] | None = None,
) -> RuleShape:
    """A deny rule, taken away as more cover (deny rules default to every port)."""
    shape = rule(*hosts, cidrs=cidrs, ports=ports, methods=methods, paths=paths)
    return RuleShape(shape.hosts, shape.cidrs, shape.ports, shape.methods, shape.paths, deny=True)


def region(
    *hosts: str,
    cidrs: Sequence[str] = (),
    ports: Sequence[int | tuple[int, int]] | None = None,
    methods: Sequence[str] | None = None,
    paths: Sequence[str] | None = None,
) -> RuleShape:
    """A ceiling region (every port unless told)."""
    return rule(*hosts, cidrs=cidrs, ports=ports, methods=methods, paths=paths)


# (rule, regions, the counter-example's URL or None when inside)
CASES = {
    "*.a.com is not inside b.a.com": (rule("*.a.com"), [region("b.a.com")], "GET https://x.a.com/"),
    "b.a.com is inside *.a.com": (rule("b.a.com"), [region("*.a.com")], None),
    "*.a.com is inside b.a.com and *.a.com together": (
        rule("*.a.com"),
        [region("b.a.com"), region("*.a.com")],
        None,
    ),
    "*.a.com does not cover a.com itself": (rule("a.com"), [region("*.a.com")], "GET https://a.com/"),
    "a.com does not cover its subdomains": (rule("*.a.com"), [region("a.com")], "GET https://x.a.com/"),
    "*.b.a.com is inside *.a.com": (rule("*.b.a.com", "c.b.a.com"), [region("*.a.com")], None),
    "* is not inside *.a.com": (rule("*"), [region("*.a.com")], "GET https://a.com/"),
    "* is inside *": (rule("*", "a.com"), [region("*")], None),
    "* never covers an IP literal": (rule(cidrs=["10.0.0.0/8"]), [region("*")], "GET https://10.0.0.0/"),
    "ports split across two regions are inside together": (
        rule("a.com", ports=[80, 443]),
        [region("a.com", ports=[443]), region("a.com", ports=[80])],
        None,
    ),
    "ports inside two ranges": (
        rule("a.com", ports=[80, 8443, 9000]),
        [region("a.com", ports=[(1, 100)]), region("a.com", ports=[(8000, 9000)])],
        None,
    ),
    "a port no region has": (
        rule("a.com", ports=[443, 8080]),
        [region("a.com", ports=[443])],
        "GET https://a.com:8080/",
    ),
    "a /24 inside a /16": (rule(cidrs=["10.1.2.0/24"]), [region(cidrs=["10.1.0.0/16"])], None),
    "a /24 split across two /25 regions": (
        rule(cidrs=["10.1.2.0/24"]),
        [region(cidrs=["10.1.2.128/25"]), region(cidrs=["10.1.2.0/25"])],
        None,
    ),
    "a /16 across regions with a gap": (
        rule(cidrs=["10.1.0.0/16"]),
        [region(cidrs=["10.1.0.0/17"]), region(cidrs=["10.1.128.0/18"])],
        "GET https://10.1.192.0/",
    ),
    "an IPv4-mapped network is the IPv4 network": (
        rule(cidrs=["::ffff:10.1.0.0/112"]),
        [region(cidrs=["10.1.0.0/16"])],
        None,
    ),
    "an IPv4 network is inside its IPv4-mapped form": (
        rule(cidrs=["10.1.2.0/24"]),
        [region(cidrs=["::ffff:10.0.0.0/104"])],
        None,
    ),
    "::/0 is not inside 0.0.0.0/0": (
        rule(cidrs=["::/0"]),
        [region(cidrs=["0.0.0.0/0"])],
        "GET https://[::1]/",
    ),
    "a name is not inside a network": (
        rule("a.com"),
        [region(cidrs=["0.0.0.0/0", "::/0"])],
        "GET https://a.com/",
    ),
    "/v1/** matches /v1 itself, which /v1/* and /v1/x/** do not": (
        rule("a.com", paths=["/v1/**"]),
        [region("a.com", paths=["/v1/*", "/v1/x/**"])],
        "GET https://a.com/v1",
    ),
    "/v1/** and deeper paths than /v1/* and /v1/x/** cover": (
        rule("a.com", paths=["/v1/**"]),
        [region("a.com", paths=["/v1", "/v1/*", "/v1/x/**"])],
        "GET https://a.com/v1/q/",
    ),
    "/v1/** is inside /v1, /v1/* and /v1/*/**": (
        rule("a.com", paths=["/v1/**"]),
        [region("a.com", paths=["/v1", "/v1/*"]), region("a.com", paths=["/v1/*/**"])],
        None,
    ),
    "/v1/* is inside /v1/**": (rule("a.com", paths=["/v1/*"]), [region("a.com", paths=["/v1/**"])], None),
    "** inside a segment crosses segments, * does not": (
        rule("a.com", paths=["/a**"]),
        [region("a.com", paths=["/a*"])],
        "GET https://a.com/a/",
    ),
    "? is one character of a segment": (
        rule("a.com", paths=["/v?/x"]),
        [region("a.com", paths=["/v1/x", "/v2/*"])],
        "GET https://a.com/vq/x",
    ),
    "a sub-delimiter in a glob also matches its escape": (
        rule("a.com", paths=["/a!b"]),
        [region("a.com", paths=["/a%21b"])],
        "GET https://a.com/a!b",
    ),
    "an escape is inside the sub-delimiter that matches it": (
        rule("a.com", paths=["/a%21b"]),
        [region("a.com", paths=["/a!b"])],
        None,
    ),
    "a rule without paths passes paths only a region without paths covers": (
        rule("a.com"),
        [region("a.com", paths=["/**"])],
        "GET https://a.com//",
    ),
    "a rule covered path by path by two regions": (
        rule("a.com", paths=["/x/**", "/y/**"]),
        [region("a.com", paths=["/x/**"]), region("a.com", paths=["/y/**"])],
        None,
    ),
    "a rule without methods is not inside a GET region": (
        rule("a.com"),
        [region("a.com", methods=["GET"])],
        "POST https://a.com/",
    ),
    "methods split across regions": (
        rule("a.com", methods=["GET", "POST"]),
        [region("a.com", methods=["GET"]), region("a.com", methods=["POST"])],
        None,
    ),
    "a method region does not take raw TCP": (
        rule("a.com", raw_tcp=True),
        [region("a.com", methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"])],
        "X0 https://a.com/",
    ),
    "a paths region does not take raw TCP": (
        rule("a.com", raw_tcp=True),
        [region("a.com", paths=["/**"]), region("a.com", paths=["/**"])],
        "tcp://a.com:443",
    ),
    "raw TCP is inside a region without methods and paths": (
        rule("a.com", raw_tcp=True),
        [region("a.com", ports=[443])],
        None,
    ),
    "hosts and ports covered across dimensions": (
        rule("a.com", "b.com", ports=[80, 443]),
        [region("a.com"), region("b.com", ports=[443]), region("b.com", ports=[80])],
        None,
    ),
    "hosts and ports with one corner left": (
        rule("a.com", "b.com", ports=[80, 443]),
        [region("a.com"), region("b.com", ports=[443])],
        "GET http://b.com/",
    ),
    "a fresh name is found when the reserved TLDs are regions": (
        rule("*"),
        [region("*.invalid", "*.test", "invalid", "test"), region("a.com")],
        "GET https://other.other0/",
    ),
    "nothing is inside an empty ceiling": (rule("a.com"), [], "GET https://a.com/"),
    "a deny rule takes a host away": (
        rule("*.a.com"),
        [region("*.a.com", ports=[443]), deny("b.a.com")],
        None,
    ),
    "a deny rule's paths fold case": (rule("a.com", paths=["/V1/x"]), [deny("a.com", paths=["/v1/*"])], None),
    "a deny rule's paths take the unreadable ones, not the * target": (
        rule("a.com"),
        [region("a.com", paths=["/**"]), deny("a.com", paths=["/**"])],
        "GET https://a.com with request target *",
    ),
    "a deny rule with paths leaves raw TCP alone": (
        rule("a.com", raw_tcp=True),
        [deny("a.com", paths=["/**"]), deny("a.com", methods=["GET"])],
        "tcp://a.com:443",
    ),
    "a deny rule with methods takes those methods": (
        rule("a.com", methods=["GET", "DELETE"]),
        [region("a.com", methods=["GET"]), deny("a.com", methods=["DELETE"])],
        None,
    ),
}


@pytest.mark.parametrize(("shape", "regions", "expected"), list(CASES.values()), ids=list(CASES))
def test_excess(shape: RuleShape, regions: list[RuleShape], expected: str | None) -> None:
    found = excess(shape, regions)
    assert (str(found) if found is not None else None) == expected
    if found is not None:
        assert gateway_allows([shape], found, region=False)
        assert not gateway_allows(regions, found, region=True)
        if found.path is not None and not found.unreadable_path:
            assert readable(found.path)


def test_a_raw_tcp_counter_example_is_raw() -> None:
    found = excess(rule("a.com", raw_tcp=True), [region("a.com", paths=["/**"])])
    assert found is not None and found.method == RAW_TCP and found.path is None
    assert found.as_dict()["scheme"] == "tcp"


def test_the_counter_example_names_a_public_looking_address_not_zero() -> None:
    found = excess(rule(cidrs=["0.0.0.0/0"]), [region(cidrs=["128.0.0.0/1"])])
    assert found is not None and found.host == "0.0.0.1"


def test_always_human_overlap_names_the_entry_and_a_request() -> None:
    human = [region("pypi.org"), region("api.github.com", methods=["POST"])]
    hit = overlap(rule("*.github.com"), human)
    assert hit is not None
    entry, request = hit
    assert entry is human[1]
    assert str(request) == "POST https://api.github.com/"
    assert gateway_allows([rule("*.github.com")], request, region=False)
    assert gateway_allows([entry], request, region=True)


def test_no_overlap_with_always_human_elsewhere() -> None:
    assert overlap(rule("*.pythonhosted.org"), [region("api.github.com"), region("pypi.org")]) is None
    # Same host, other port: no request of the rule is always-human.
    assert overlap(rule("api.github.com", ports=[443]), [region("api.github.com", ports=[22])]) is None


def test_a_proposed_rule_against_a_loaded_ceiling(tmp_path: Path) -> None:
    """What automatic approval asks: a proposal (a tenant rule) inside the regions, and not
    touching an always-human entry."""
    path = tmp_path / "ceiling.yaml"
    path.write_text(
        "regions:\n"
        "  - hosts: ['*.github.com']\n"
        "    ports: [443]\n"
        "    methods: [GET]\n"
        "always_human:\n"
        "  - hosts: [api.github.com]\n"
    )
    ceiling = load_ceiling(path)
    read = RuleShape.from_rule(Rule.model_validate({"hosts": ["codeload.github.com"], "methods": ["GET"]}))
    assert read.ports.spans == ((443, 443),) and read.rule_id == "proposal"
    assert excess(read, ceiling) is None and overlap(read, ceiling) is None
    write = RuleShape.from_rule(Rule.model_validate({"id": "push", "hosts": ["api.github.com"]}))
    assert str(excess(write, ceiling)) == "POST https://api.github.com/"
    hit = overlap(write, ceiling)
    assert hit is not None and hit[0] is ceiling.always_human[0]
    assert str(hit[1]) == "GET https://api.github.com/"
    tcp = RuleShape.from_rule(Rule.model_validate({"hosts": ["x.github.com"], "protocol": "tcp"}))
    assert tcp.raw_tcp and str(excess(tcp, ceiling)) == "POST https://x.github.com/"


def test_always_human_paths_fold_case_as_deny_rules_do() -> None:
    # An upstream may fold `/REPOS` into `/repos`: the entry is matched as a deny rule is.
    hit = overlap(
        rule("api.github.com", paths=["/REPOS/**"]), [region("api.github.com", paths=["/repos/**"])]
    )
    assert hit is not None and hit[1].path is not None and hit[1].path.lower().startswith("/repos")


def test_globs_naming_every_stand_in_character_are_undecided_not_inside() -> None:
    every = "/" + string.ascii_letters + string.digits + "-_"
    with pytest.raises(ProofTooLarge):
        excess(rule("a.com", paths=[every]), [region("a.com", paths=["/x"])])


def test_a_name_outside_the_regions_is_a_lookup_excess() -> None:
    assert lookup_excess(rule("*.evil.test", methods=["GET"]), [region("pypi.org")]) == "x.evil.test"
    assert lookup_excess(rule("b.a.com"), [region("*.a.com", ports=[22])]) is None
    assert lookup_excess(rule(cidrs=["10.0.0.0/8"]), [region("pypi.org")]) is None
