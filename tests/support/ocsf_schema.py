"""OCSF events checked against the published OCSF 1.8.0 schema (the `ocsf-json-schema` package
ships its export and builds a draft 2020-12 JSON Schema per class and profile set)."""

from __future__ import annotations

from functools import cache
from typing import Any

from jsonschema import Draft202012Validator  # type: ignore[import-untyped]
from ocsf_json_schema import OcsfJsonSchemaEmbedded, get_ocsf_schema  # type: ignore[import-untyped]

__all__ = ["schema_errors", "validate_event"]

VERSION = "1.8.0"


@cache
def _schema() -> OcsfJsonSchemaEmbedded:
    return OcsfJsonSchemaEmbedded(get_ocsf_schema(VERSION))


@cache
def _validator(class_uid: int, profiles: tuple[str, ...]) -> Draft202012Validator:
    schema = _schema()
    class_schema = schema.get_class_schema(schema.lookup_class_name_from_uid(class_uid), list(profiles))
    Draft202012Validator.check_schema(class_schema)
    return Draft202012Validator(class_schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def schema_errors(event: dict[str, Any]) -> list[str]:
    """What the schema of the event's class (with the profiles its metadata names) finds wrong."""
    profiles = tuple(sorted(event.get("metadata", {}).get("profiles", [])))
    validator = _validator(int(event["class_uid"]), profiles)
    return sorted(
        f"{'/'.join(map(str, e.absolute_path)) or '<event>'}: {e.message}"
        for e in validator.iter_errors(event)
    )


def validate_event(event: dict[str, Any]) -> None:
    """Fail with every schema error of `event`."""
    errors = schema_errors(event)
    assert not errors, "\n".join(errors)
