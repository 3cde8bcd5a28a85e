"""The scrubber's tally: how many replacements it made, by the placeholder each put in (for
the audit's `secret_scrubbed` finding), whole or streamed, and nothing when nothing matched."""

from __future__ import annotations

import base64

import pytest

from sandgate.brokers import Scrubber, Secret
from sandgate.brokers.scrub import Tally

SECRET = "sk-live-4f9a2c7e1b3d5f7a"
OTHER = "ghs_16C7e42F292c6912E7710c838347Ae178B4a"
P = "sgph_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
Q = "sgph_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"


@pytest.fixture
def scrubber() -> Scrubber:
    return Scrubber([(Secret(SECRET), P), (Secret(OTHER), Q)])


def test_each_replacement_is_counted_under_its_placeholder(scrubber: Scrubber) -> None:
    tally: Tally = {}
    body = f"{SECRET} and {OTHER} and ".encode() + base64.b64encode(SECRET.encode())
    out = scrubber.scrub(body, tally)
    assert SECRET.encode() not in out and OTHER.encode() not in out
    assert tally == {P: 2, Q: 1}


def test_headers_and_text_count_into_the_same_tally(scrubber: Scrubber) -> None:
    tally: Tally = {}
    scrubber.scrub_headers([("x-echo", f"Bearer {SECRET}"), ("x-other", "nothing")], tally)
    scrubber.scrub_text(OTHER, tally)
    assert tally == {P: 1, Q: 1}


def test_a_stream_counts_a_form_split_across_chunks_once(scrubber: Scrubber) -> None:
    tally: Tally = {}
    stream = scrubber.stream(tally=tally)
    body = b"x" * 100 + SECRET.encode() + b"y" * 100 + SECRET.encode()
    cut = 100 + len(SECRET) // 2
    out = b"".join([*stream(body[:cut]), *stream(body[cut:]), *stream(b"")])
    assert out == b"x" * 100 + P.encode() + b"y" * 100 + P.encode()
    assert tally == {P: 2}


def test_nothing_matched_leaves_the_tally_empty_and_the_body_as_it_was(scrubber: Scrubber) -> None:
    tally: Tally = {}
    body = b"an answer with no secret in it" * 100
    assert scrubber.scrub(body, tally) == body
    assert tally == {}


def test_without_a_tally_scrubbing_is_unchanged(scrubber: Scrubber) -> None:
    assert scrubber.scrub(SECRET.encode()) == P.encode()
