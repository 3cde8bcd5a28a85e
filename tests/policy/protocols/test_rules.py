"""Tests for sandgate.policy.protocols.rules: rule sections validated entry by entry at load,
failing closed by default."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from sandgate.policy.protocols.rules import GraphqlSection, JsonRpcSection, McpSection


def test_an_empty_mcp_section_allows_the_plumbing_and_no_tool() -> None:
    section = McpSection()
    assert section.methods.allowed("initialize") is not None
    assert section.methods.allowed("tasks/get") is None
    assert section.tools.allowed("anything") is None
    assert section.resources.allowed("file:///x") is None


def test_an_empty_graphql_section_allows_queries_only_without_introspection() -> None:
    section = GraphqlSection()
    assert (section.operation_types, section.introspection) == (["query"], False)


INVALID = [
    (
        McpSection,
        {"tools": {"allow": ["delete repo"]}},
        "tools.allow.0",
        "a tool glob with a space is refused",
    ),
    (
        McpSection,
        {"tools": {"deny": ["del\u0435te_*"]}},
        "tools.deny.0",
        "a tool glob with a confusable is refused",
    ),
    (
        McpSection,
        {"tools": {"deny": ["a", ""]}},
        "tools.deny.1",
        "an empty tool glob is refused, naming its index",
    ),
    (
        McpSection,
        {"tools": {"arguments": {"bad name": []}}},
        "tools.arguments",
        "an arguments key that is no tool glob is refused",
    ),
    (
        McpSection,
        {"tools": {"arguments": {"t": [{"path": "a", "regex": "(?<=x)"}]}}},
        "a lookaround",
        "an argument regex with lookbehind is refused at load",
    ),
    (McpSection, {"tools": {"allowed": ["x"]}}, "Extra inputs", "a misspelt key is refused"),
    (
        McpSection,
        {"resources": {"allow": ["file:///a b"]}},
        "resources.allow.0",
        "a uri glob with a space is refused",
    ),
    (
        JsonRpcSection,
        {"methods": {"allow": ["eth call"]}},
        "methods.allow.0",
        "a method glob with a space is refused",
    ),
    (
        GraphqlSection,
        {"operation_types": ["delete"]},
        "operation_types.0",
        "an unknown operation type is refused",
    ),
    (
        GraphqlSection,
        {"root_fields": {"deny": ["Mutation.x"]}},
        "root_fields.deny.0",
        "a field qualified by a type name is refused",
    ),
    (
        GraphqlSection,
        {"persisted_queries": ["ABC"]},
        "persisted_queries.0",
        "a persisted id that is no sha256 is refused",
    ),
    (GraphqlSection, {"max_depth": 0}, "max_depth", "a zero depth is refused"),
]


@pytest.mark.parametrize(("model", "data", "where"), [c[:3] for c in INVALID], ids=[c[3] for c in INVALID])
def test_invalid_sections_are_refused_naming_the_entry(model: Any, data: dict[str, Any], where: str) -> None:
    with pytest.raises(ValidationError) as caught:
        model.model_validate(data)
    text = str(caught.value).replace("\n", ".")
    assert where in text or where in str(caught.value)


def test_sections_export_a_json_schema_with_descriptions() -> None:
    schema = McpSection.model_json_schema()
    assert "description" in schema["$defs"]["McpTools"]["properties"]["deny"]
