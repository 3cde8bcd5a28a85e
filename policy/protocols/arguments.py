"""Argument predicates: conditions on a tool call's (nested JSON) arguments. No I/O.

A predicate names a `path` into the arguments and one test:

- `path`: keys joined by `.`, each optionally followed by `[N]` (one element) or `[*]`
  (every element): `repo`, `owner.login`, `items[0]`, `labels[*]`, `files[*].path`. Keys
  are `A-Z a-z 0-9 _ - $ @`; a key with other characters cannot be named (write Rego).
- `equals` / `one_of`: a JSON scalar, compared with its type (`1` is not `true` nor `"1"`);
- `prefix`, `glob`, `regex`: strings only, compared as sent (no normalisation: anchor what
  you mean); `regex` matches the whole value within a time bound (running out of time
  fails the predicate; sandgate.policy.protocols.patterns says which regexes are refused);
- `min` / `max`: numbers only (a bool is not a number);
- `max_length`: characters of a string, elements of an array.

Evaluation fails closed: a path that is missing fails unless `optional: true`; a path
whose shape is wrong (a key into a string, an index into an object) always fails; `[*]`
needs every element to pass (an empty array passes: no element breaks the rule).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Final

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    model_validator,
)

from sandgate.policy.protocols.json_strict import JsonValue
from sandgate.policy.protocols.patterns import BoundedPattern, compile_globs, compile_regex

__all__ = ["ArgumentPredicate", "PredicateFailure", "check_arguments", "parse_path", "values_at"]

# A `[*]` step: every element of an array.
EACH: Final = "[*]"
type Step = str | int
type Scalar = StrictStr | StrictInt | StrictFloat | StrictBool | None

_PART = re.compile(r"([A-Za-z0-9_$@-]+)((?:\[(?:[0-9]{1,6}|\*)\])*)", re.ASCII)
_BRACKET = re.compile(r"\[([0-9]+|\*)\]", re.ASCII)
_TESTS = ("equals", "one_of", "prefix", "glob", "regex", "range", "max_length")
_MAX_PATH = 256


def parse_path(path: str) -> tuple[Step, ...]:
    """The steps of an argument path (keys, indexes, EACH), or ValueError."""
    if not path or len(path) > _MAX_PATH:
        raise ValueError(f"a path has 1 to {_MAX_PATH} characters")
    steps: list[Step] = []
    for part in path.split("."):
        m = _PART.fullmatch(part)
        if m is None:
            raise ValueError(f"{path!r}: write keys joined by '.', each with optional [N] or [*]")
        steps.append(m[1])
        steps.extend(EACH if b == "*" else int(b) for b in _BRACKET.findall(m[2]))
    return tuple(steps)


@dataclass(frozen=True, slots=True)
class _Compiled:
    """A predicate as checked: its parsed path, its one test, its pattern (glob or regex)."""

    steps: tuple[Step, ...]
    test: str
    pattern: BoundedPattern | None


class ArgumentPredicate(BaseModel):
    """One condition on a tool call's arguments: a path and exactly one test."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(description="where in the arguments: `repo`, `owner.login`, `items[0]`, `labels[*]`")
    equals: Scalar = Field(default=None, description="the value, compared with its JSON type")
    one_of: Annotated[list[Scalar], Field(min_length=1, max_length=1000)] | None = Field(
        default=None, description="allowed values, compared with their JSON type"
    )
    prefix: StrictStr | None = Field(default=None, description="a string that starts so")
    glob: Annotated[StrictStr, Field(max_length=1024)] | None = Field(
        default=None, description="a string matching the glob (`*` any run, `?` one character)"
    )
    regex: Annotated[StrictStr, Field(max_length=1024)] | None = Field(
        default=None, description="a string the regex matches whole (no backreferences or lookaround)"
    )
    min: StrictInt | StrictFloat | None = Field(default=None, description="a number at least this")
    max: StrictInt | StrictFloat | None = Field(default=None, description="a number at most this")
    max_length: Annotated[StrictInt, Field(ge=0)] | None = Field(
        default=None,
        description="a string of at most this many characters, or an array of this many elements",
    )
    optional: StrictBool = Field(default=False, description="a missing path passes (else it fails)")

    # Read once per value checked: one private read (pydantic's are slow), no re-derivation.
    _compiled: _Compiled = PrivateAttr()

    @model_validator(mode="after")
    def _compile(self) -> ArgumentPredicate:
        tests = self.tests_given()
        if len(tests) != 1:
            raise ValueError(
                f"give exactly one test of {', '.join(_TESTS)} (min/max are one range); got {tests}"
            )
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError("min is above max")
        pattern: BoundedPattern | None = None
        if self.regex is not None:
            pattern = compile_regex(self.regex)
        elif self.glob is not None:
            pattern = compile_globs([self.glob])
        self._compiled = _Compiled(parse_path(self.path), tests[0], pattern)
        return self

    def tests_given(self) -> list[str]:
        """The tests this predicate names (`range` for min and/or max)."""
        given = self.model_fields_set
        tests = [t for t in _TESTS if t in given and t != "range"]
        if "min" in given or "max" in given:
            tests.append("range")
        return tests

    @property
    def steps(self) -> tuple[Step, ...]:
        """The parsed path."""
        return self._compiled.steps

    @property
    def test(self) -> str:
        return self._compiled.test

    def describe(self) -> str:
        """The predicate in a few words, for a denial message: `repo one_of [...]`."""
        test = self.test
        if test == "range":
            return f"{self.path} in [{self.min}, {self.max}]"
        value = getattr(self, test)
        return f"{self.path} {test} {value!r}"[:200]

    def value_problem(self, value: JsonValue) -> str | None:
        """Why one value fails this predicate's test, or None when it passes."""
        compiled = self._compiled
        match compiled.test:
            case "equals":
                return None if _same(value, self.equals) else "is not the required value"
            case "one_of":
                return None if any(_same(value, v) for v in self.one_of or ()) else "is not an allowed value"
            case "prefix":
                ok = isinstance(value, str) and value.startswith(self.prefix or "")
                return None if ok else "does not start with the required prefix"
            case "glob" | "regex":
                if not isinstance(value, str) or compiled.pattern is None:
                    return f"does not match the {compiled.test}"
                hit = compiled.pattern.check(value)
                if hit is None:
                    return f"was not matched by the {compiled.test} in time (a timeout fails)"
                return None if hit else f"does not match the {compiled.test}"
            case "range":
                return _range_problem(value, self.min, self.max)
            case _:
                return _length_problem(value, self.max_length or 0)


@dataclass(frozen=True, slots=True)
class PredicateFailure:
    """Which predicate failed (its place in the list) and why, for the denial message."""

    index: int
    predicate: ArgumentPredicate
    why: str

    def describe(self) -> str:
        return f"{self.predicate.describe()}: {self.why}"


def check_arguments(
    predicates: Iterable[ArgumentPredicate], arguments: dict[str, JsonValue]
) -> PredicateFailure | None:
    """The first predicate the arguments fail, or None when all pass."""
    for index, predicate in enumerate(predicates):
        why = _evaluate(predicate, arguments)
        if why is not None:
            return PredicateFailure(index, predicate, why)
    return None


def _evaluate(predicate: ArgumentPredicate, arguments: dict[str, JsonValue]) -> str | None:
    """Why the arguments fail one predicate, or None."""
    values, missing, shape = _resolve(predicate.steps, arguments)
    if shape is not None:
        return shape
    if missing and not predicate.optional:
        return "is missing"
    for value in values:
        problem = predicate.value_problem(value)
        if problem is not None:
            return problem
    return None


def _resolve(steps: tuple[Step, ...], root: JsonValue) -> tuple[list[JsonValue], int, str | None]:
    """The values a path reaches, how many of its branches were missing, and a shape problem."""
    current: list[JsonValue] = [root]
    missing = 0
    for step in steps:
        found: list[JsonValue] = []
        for value in current:
            if step == EACH or isinstance(step, int):
                if not isinstance(value, list):
                    return [], missing, "is not an array where the path indexes one"
                if isinstance(step, int):
                    if step < len(value):
                        found.append(value[step])
                    else:
                        missing += 1
                else:
                    found.extend(value)
            elif not isinstance(value, dict):
                return [], missing, "is not an object where the path names a key"
            elif step in value:
                found.append(value[step])
            else:
                missing += 1
        current = found
    return current, missing, None


def _same(value: JsonValue, expected: JsonValue) -> bool:
    """JSON equality with types: a bool equals only a bool, a number only a number."""
    if isinstance(value, bool) or isinstance(expected, bool):
        return isinstance(value, bool) and isinstance(expected, bool) and value == expected
    if _is_number(value) and _is_number(expected):
        return value == expected
    return type(value) is type(expected) and value == expected


def _is_number(value: JsonValue) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _range_problem(value: JsonValue, low: float | None, high: float | None) -> str | None:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return "is not a number"
    if low is not None and value < low:
        return "is below the minimum"
    if high is not None and value > high:
        return "is above the maximum"
    return None


def _length_problem(value: JsonValue, limit: int) -> str | None:
    if not isinstance(value, str | list):
        return "is neither a string nor an array"
    return None if len(value) <= limit else "is too long"


def values_at(path: str, arguments: JsonValue) -> list[JsonValue]:
    """The values a path reaches in the arguments (none when it is missing or misshapen)."""
    values, _, shape = _resolve(parse_path(path), arguments)
    return [] if shape is not None else values
