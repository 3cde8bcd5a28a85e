"""Tests for sandgate.policy.protocols.patterns: globs and regexes, whole-string matching,
case folding only where asked, which entry of a list matched, the time bound (a timeout
never allows) and the regexes refused at load."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from functools import cache

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandgate.policy.protocols.errors import PatternError
from sandgate.policy.protocols.patterns import GlobList, compile_globs, compile_regex


@pytest.mark.parametrize(
    ("glob", "text", "fold", "matches"),
    [
        ("delete_*", "delete_repo", False, True),
        ("delete_*", "Delete_repo", False, False),
        ("delete_*", "Delete_repo", True, True),
        ("a?c", "abc", False, True),
        ("a?c", "abbc", False, False),
        ("a.b", "axb", False, False),
        ("repo://octo/*", "repo://octo/a/b", False, True),
        ("*", "", False, True),
        ("x", "x\n", False, False),
        ("(a)[b]", "(a)[b]", False, True),
    ],
)
def test_globs(glob: str, text: str, fold: bool, matches: bool) -> None:
    assert compile_globs([glob], fold_case=fold).fullmatch(text) is matches


def test_a_glob_list_names_the_first_entry_that_matches() -> None:
    globs = GlobList(["search_*", "get_issue", "*"])
    assert (globs.match("search_x"), globs.match("get_issue"), globs.match("other")) == (0, 1, 2)


def test_a_glob_list_prefers_an_earlier_glob_over_a_later_exact_name() -> None:
    assert GlobList(["get_*", "get_issue"]).match("get_issue") == 0


def test_a_folded_glob_list_matches_exact_names_in_any_case() -> None:
    assert GlobList(["Delete_Repo"], fold_case=True).match("delete_repo") == 0
    assert GlobList(["Delete_Repo"]).match("delete_repo") is None


def test_an_empty_glob_list_matches_nothing() -> None:
    assert GlobList([]).match("") is None
    assert compile_globs([]).fullmatch("") is False


@pytest.mark.parametrize(
    ("pattern", "text"),
    [("(x+x+)+y", "x" * 5_000), ("(a+)+$", "a" * 50_000 + "b")],
    ids=["nested plus", "nested plus before an anchor"],
)
def test_a_catastrophic_regex_runs_out_of_time_and_does_not_match(pattern: str, text: str) -> None:
    compiled = compile_regex(pattern)
    start = time.perf_counter()
    assert compiled.check(text) is None
    assert compiled.fullmatch(text) is False
    assert time.perf_counter() - start < 1


def test_a_regex_that_backtracks_within_the_bound_answers() -> None:
    assert compile_regex("(a|aa)*c").check("a" * 5_000) is False
    assert compile_regex("(a|aa)*c").check("aaac") is True


def test_a_lone_surrogate_never_matches() -> None:
    assert compile_regex(".*").fullmatch("\ud800") is False


REFUSED = [
    ("(a)\\1", "a backreference", "a numbered backreference"),
    ("(?P<n>a)(?P=n)", "a backreference", "a named backreference"),
    ("(?=a)a", "a lookaround", "a lookahead"),
    ("(?!a)b", "a lookaround", "a negative lookahead"),
    ("(?<=a)b", "a lookaround", "a lookbehind"),
    ("(?<!a)b", "a lookaround", "a negative lookbehind"),
    ("(a)?(?(1)b|c)", "a conditional", "a conditional on a group"),
    ("(?>a+)b", "an atomic group", "an atomic group"),
    ("a*+b", "a possessive repeat", "a possessive repeat"),
    ("a{2000}", "at most", "a repeat over 1000"),
    ("(?:abc){e<=1}", "starts no repeat", "a fuzzy match (regex's own syntax)"),
    ("x{y", "starts no repeat", "a bare brace"),
    ("[[:alpha:]]", "nested set", "a POSIX class"),
    ("\\p{L}", "bad escape", "a Unicode property (regex's own syntax)"),
    ("(?V1)a", "unknown extension", "regex's version flag"),
    ("(", "missing", "an unbalanced parenthesis"),
    ("(" * 400 + "a" + ")" * 400, "nests at most", "groups nested 400 deep"),
]


@pytest.mark.parametrize(("pattern", "why"), [c[:2] for c in REFUSED], ids=[c[2] for c in REFUSED])
def test_a_regex_is_refused_at_load_naming_it_and_why(pattern: str, why: str) -> None:
    with pytest.raises(PatternError) as caught:
        compile_regex(pattern)
    assert repr(pattern[:80]) in str(caught.value)
    assert why in str(caught.value)


@pytest.mark.parametrize(
    ("pattern", "text"),
    [("\\{a\\}", "{a}"), ("a{,3}", "aaa"), ("a{2,}b{1000}", "aa" + "b" * 1000), ("(?i)ABC", "abc")],
    ids=["an escaped brace", "an upper bound", "counted repeats", "an inline flag"],
)
def test_a_bounded_regex_is_accepted(pattern: str, text: str) -> None:
    assert compile_regex(pattern).fullmatch(text)


def test_a_regex_is_at_most_1024_characters() -> None:
    compile_regex("a" * 1024)
    with pytest.raises(PatternError, match="at most 1024"):
        compile_regex("a" * 1025)


def test_match_all_answers_every_matching_entry_in_order() -> None:
    globs = GlobList(["create_*", "Create_Issue", "*_issue", "other", "create_issue"], fold_case=True)
    assert globs.match_all("create_issue") == [0, 1, 2, 4]
    assert globs.match("CREATE_ISSUE") == 0


def test_a_hundred_globs_are_matched_in_one_pass() -> None:
    globs = GlobList([f"tool{i}_*" for i in range(100)] + ["create_*"])
    assert globs.match("create_issue") == 100
    assert globs.match("tool42_x") == 42
    assert globs.match("nothing") is None


def test_match_all_answers_exact_names_and_globs() -> None:
    globs = GlobList(["a*", "abc", "*c", "x"])
    assert (globs.match_all("abc"), globs.match_all("x"), globs.match_all("zz")) == ([0, 1, 2], [3], [])


def test_a_glob_with_many_stars_does_not_backtrack() -> None:
    glob = compile_globs(["*a*a*a*a*a*a*a*a*b"])
    start = time.perf_counter()
    assert glob.check("a" * 100_000) is False
    assert glob.check("a" * 100_000 + "b") is True
    assert time.perf_counter() - start < 1


@cache
def _glob_matches(glob: str, text: str) -> bool:
    """A reference glob matcher, by recursion."""
    if not glob:
        return not text
    if glob[0] == "*":
        return any(_glob_matches(glob[1:], text[i:]) for i in range(len(text) + 1))
    return bool(text) and glob[0] in ("?", text[0]) and _glob_matches(glob[1:], text[1:])


@given(st.text("ab*?", max_size=8), st.text("ab", max_size=10))
def test_globs_match_as_the_reference_matcher(glob: str, text: str) -> None:
    assert compile_globs([glob]).fullmatch(text) is _glob_matches(glob, text)


@given(st.lists(st.text("ab*?", min_size=1, max_size=5), max_size=6), st.text("ab", max_size=8))
def test_a_glob_list_answers_as_its_globs_one_by_one(globs: list[str], text: str) -> None:
    expected = [i for i, glob in enumerate(globs) if _glob_matches(glob, text)]
    assert GlobList(globs).match_all(text) == expected
    assert GlobList(globs).match(text) == (expected[0] if expected else None)


# A timeout of 0 runs out at once: every glob of the list times out.
def test_a_timeout_never_matches_an_allow_list() -> None:
    allow = GlobList(["search_*", "get_issue", "*"], timeout=0)
    assert (allow.match("search_code"), allow.match("get_issue")) == (None, 1)
    assert allow.match_all("get_issue") == [1]


def test_a_timeout_matches_a_deny_or_ask_list() -> None:
    deny = GlobList(["exact", "delete_*", "admin*"], fold_case=True, timeout_matches=True, timeout=0)
    assert (deny.match("search_code"), deny.match("EXACT")) == (1, 0)
    assert deny.match_all("exact") == [0, 1, 2]


def test_a_match_is_bounded_in_time_even_after_a_timeout() -> None:
    deny = GlobList([f"*{i}*" for i in range(100)], timeout_matches=True, timeout=0)
    start = time.perf_counter()
    assert deny.match("x" * 128) == 0
    assert time.perf_counter() - start < 0.1


def test_a_name_that_is_not_valid_unicode_is_a_fault() -> None:
    with pytest.raises(UnicodeEncodeError):
        GlobList(["*"]).match("\ud800")


# google-re2 and rego-cpp (regopy) each bundle RE2; loaded in one process, compiling an RE2
# set aborted it. The gateway loads regopy first: so does this guard, in a fresh process.
_CRASH_GUARD = textwrap.dedent(
    """
    import regopy
    import sandgate.policy.decide
    from sandgate.policy.protocols.rules import McpSection

    section = McpSection.model_validate({"tools": {
        "allow": ["search_*", "get_issue"], "deny": ["delete_*"], "ask": ["write_*"],
        "arguments": {"search_*": [{"path": "q", "regex": "[a-z]+( [a-z]+)*"}]},
    }})
    tools = section.tools
    assert (tools.allowed("search_code"), tools.denied("DELETE_repo"), tools.asked("write_x")) == (0, 0, 0)
    [(key, predicates)] = tools.predicates_for("search_code")
    assert predicates[0].value_problem("two words") is None
    assert predicates[0].value_problem("Two") is not None
    """
)


def test_patterns_load_and_match_beside_rego_cpp() -> None:
    done = subprocess.run([sys.executable, "-c", _CRASH_GUARD], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
