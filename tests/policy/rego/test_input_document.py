"""Tests for sandgate.policy.rego.input_document: the versioned input document, redaction, projection."""

from __future__ import annotations

import pytest

from sandgate.policy.decision import EgressRequest, Identity, Phase
from sandgate.policy.rego.input_document import (
    REDACTED,
    InputDocument,
    cache_key,
    input_document,
    input_schema,
    is_secret_name,
    path_tree,
    project,
)

WHO = Identity("acme", "acme-1")


def request(**kw: object) -> EgressRequest:
    base: dict[str, object] = {
        "phase": Phase.REQUEST,
        "host": "api.example.com",
        "port": 443,
        "scheme": "https",
        "method": "GET",
        "path": "/v1/items",
        "sni": "api.example.com",
    }
    base.update(kw)
    return EgressRequest(**base)  # type: ignore[arg-type]


def test_the_document_has_every_field_of_version_2() -> None:
    doc = input_document(
        WHO,
        request(
            query="a=1&a=2&b=",
            headers=(("Accept", "*/*"), ("X-Trace", "1"), ("x-trace", "2")),
            body_size=12,
            client="10.0.0.2",
            credentials=("github",),
        ),
        "93.184.215.14",
    )
    assert doc == {
        "version": 2,
        "phase": "request",
        "tenant": "acme",
        "sandbox": "acme-1",
        "client": "10.0.0.2",
        "dest": {
            "host": "api.example.com",
            "port": 443,
            "ip": "93.184.215.14",
            "sni": "api.example.com",
            "scheme": "https",
        },
        "request": {
            "method": "GET",
            "path": "/v1/items",
            "query": {"a": ["1", "2"], "b": [""]},
            "headers": {"accept": "*/*", "x-trace": "1, 2"},
            "body_size": 12,
        },
        "credentials": ["github"],
    }
    InputDocument.model_validate(doc)


def test_a_connect_document_has_null_request_fields_and_validates() -> None:
    doc = input_document(WHO, EgressRequest(Phase.CONNECT, "api.example.com", 443), None)
    assert doc["request"] == {"method": None, "path": None, "query": {}, "headers": {}, "body_size": None}
    InputDocument.model_validate(doc)


@pytest.mark.parametrize(
    "name",
    [
        "Authorization",
        "proxy-authorization",
        "Cookie",
        "X-Api-Key",
        "X-Auth-Token",
        "x-amz-security-token",
        "client_secret",
        "api_key",
        "password",
        "X-Session-Id",
        "Signature",
    ],
)
def test_secret_looking_names_are_redacted(name: str) -> None:
    assert is_secret_name(name)
    doc = input_document(WHO, request(headers=((name, "s3cr3t"),), query=f"{name}=s3cr3t"), None)
    assert doc["request"]["headers"] == {name.lower(): REDACTED}
    assert doc["request"]["query"] == {name: [REDACTED]}
    assert "s3cr3t" not in repr(doc)


@pytest.mark.parametrize("name", ["Accept", "User-Agent", "Content-Type", "ref", "page", "keep-alive"])
def test_ordinary_names_are_kept(name: str) -> None:
    assert not is_secret_name(name)


def test_projection_keeps_only_what_the_paths_name() -> None:
    doc = input_document(WHO, request(headers=(("Accept", "a"), ("X-Id", "b"))), "1.2.3.4")
    tree = path_tree(frozenset({("dest", "host"), ("request", "headers", "x-id"), ("tenant",)}))
    assert project(doc, tree) == {
        "dest": {"host": "api.example.com"},
        "request": {"headers": {"x-id": "b"}},
        "tenant": "acme",
    }


def test_projection_of_the_whole_input_is_the_document() -> None:
    doc = input_document(WHO, request(), None)
    assert project(doc, path_tree(None)) is doc


def test_projection_skips_fields_that_are_absent_or_not_objects() -> None:
    doc = {"a": 1, "b": {"c": 2}}
    tree = path_tree(frozenset({("a", "x"), ("b", "c"), ("z",)}))
    assert project(doc, tree) == {"b": {"c": 2}}


def test_cache_keys_tell_types_apart() -> None:
    keys = {cache_key({"x": v}) for v in (1, 1.5, True, "1", None, [1], {"1": 1})}
    assert len(keys) == 7
    assert cache_key({"a": 1, "b": 2}) == cache_key({"b": 2, "a": 1})


def test_the_schema_names_every_top_level_field() -> None:
    schema = input_schema()
    assert set(schema["properties"]) == {
        "version",
        "phase",
        "tenant",
        "sandbox",
        "client",
        "dest",
        "request",
        "credentials",
        "mcp",
        "jsonrpc",
        "graphql",
    }
    assert set(schema["required"]) == set(schema["properties"]) - {"mcp", "jsonrpc", "graphql"}
    assert "version 2" in schema["title"]
