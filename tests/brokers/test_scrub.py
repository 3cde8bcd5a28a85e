"""Response scrubbing: every form of every secret becomes the placeholder, across chunks, in flat memory."""

from __future__ import annotations

import base64
import json
import time
import tracemalloc
from urllib.parse import quote, quote_plus

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandgate.brokers import Scrubber, Secret
from sandgate.brokers.scrub import MIN_SCRUB_BYTES, secret_forms

SECRET = 'sk-live/4f9a+2c7e "quoted" é 1b3d5f7a'
OTHER = "ghs_16C7e42F292c6912E7710c838347Ae178B4a"
P = "sgph_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
Q = "sgph_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
SB = SECRET.encode()


@pytest.fixture
def scrubber() -> Scrubber:
    return Scrubber([(Secret(SECRET), P), (Secret(OTHER), Q)])


FORMS = {
    "raw": SB,
    "base64": base64.b64encode(SB),
    "base64 after one byte": base64.b64encode(b"x" + SB),
    "base64 after two bytes": base64.b64encode(b"xy" + SB),
    "basic auth": b"Basic " + base64.b64encode(b"user:" + SB),
    "url-safe base64": base64.urlsafe_b64encode(b"?" + SB),
    "percent-encoded": quote(SECRET, safe="").encode(),
    "percent-encoded lower-case hex": quote(SECRET, safe="").lower().encode(),
    "form-encoded": quote_plus(SECRET, safe="").encode(),
    "json-escaped": json.dumps(SECRET).encode(),
    "json-escaped ascii": json.dumps(SECRET, ensure_ascii=True).encode(),
    "json with escaped slashes": json.dumps(SECRET).replace("/", "\\/").encode(),
}


def assert_clean(data: bytes) -> None:
    assert SB not in data
    for form in secret_forms(SB, P.encode()):
        assert form not in data


@pytest.mark.parametrize("form", FORMS.values(), ids=[f"the {k} form is scrubbed" for k in FORMS])
def test_every_form_is_scrubbed(scrubber: Scrubber, form: bytes) -> None:
    out = scrubber.scrub(b"echo: " + form + b" :end")
    assert_clean(out)
    assert out.startswith(b"echo: ") and out.endswith(b" :end")


def test_raw_and_encoded_forms_become_the_placeholder_forms(scrubber: Scrubber) -> None:
    assert scrubber.scrub(f'{{"key": "{OTHER}"}}'.encode()) == f'{{"key": "{Q}"}}'.encode()
    assert scrubber.scrub(base64.b64encode(OTHER.encode())).startswith(base64.b64encode(Q.encode())[:48])
    assert scrubber.scrub(quote(SECRET, safe="").encode()) == P.encode()


def test_headers_are_scrubbed(scrubber: Scrubber) -> None:
    headers = [("X-Echo", f"Bearer {OTHER}"), ("Location", f"/cb?token={quote(SECRET, safe='')}"), ("A", "b")]
    assert scrubber.scrub_headers(headers) == [
        ("X-Echo", f"Bearer {Q}"),
        ("Location", f"/cb?token={P}"),
        ("A", "b"),
    ]


def test_an_empty_scrubber_passes_everything() -> None:
    scrubber = Scrubber([])
    assert scrubber.empty
    assert scrubber.scrub(b"anything") == b"anything"
    assert scrubber.stream().feed(b"abc") == b"abc"


def test_values_too_short_to_scrub_are_skipped() -> None:
    assert Scrubber([(Secret("x" * (MIN_SCRUB_BYTES - 1)), P)]).empty


def stream_all(scrubber: Scrubber, chunks: list[bytes]) -> bytes:
    """What mitmproxy sends on when the stream is its stream callable: never an empty chunk
    (on HTTP/1 an empty chunk ends a chunked body)."""
    stream = scrubber.stream()
    sent = [piece for c in chunks if c for piece in stream(c)] + list(stream(b""))
    assert b"" not in sent, "an empty chunk would end the guest's body"
    return b"".join(sent)


def test_a_secret_split_at_every_chunk_boundary_is_scrubbed(scrubber: Scrubber) -> None:
    data = b"head " + SB + b" mid " + FORMS["basic auth"] + b" " + OTHER.encode() + b" tail"
    whole = scrubber.scrub(data)
    assert_clean(whole)
    for cut in range(1, len(data)):
        assert stream_all(scrubber, [data[:cut], data[cut:]]) == whole, cut
    assert stream_all(scrubber, [data[i : i + 1] for i in range(len(data))]) == whole


@settings(max_examples=200)
@given(
    st.lists(
        st.sampled_from([b"a", b"xyz ", SB, OTHER.encode(), FORMS["base64 after one byte"], b"\x00\xff"]),
        max_size=20,
    ),
    st.lists(st.integers(1, 80), min_size=1, max_size=20),
)
def test_any_chunking_gives_the_same_bytes_as_scrubbing_whole(pieces: list[bytes], sizes: list[int]) -> None:
    scrubber = Scrubber([(Secret(SECRET), P), (Secret(OTHER), Q)])
    data = b"".join(pieces)
    chunks, pos, i = [], 0, 0
    while pos < len(data):
        size = sizes[i % len(sizes)]
        chunks.append(data[pos : pos + size])
        pos += size
        i += 1
    assert stream_all(scrubber, chunks) == scrubber.scrub(data)


def test_the_stream_holds_back_less_than_the_longest_form(scrubber: Scrubber) -> None:
    stream = scrubber.stream()
    out = stream.feed(b"z" * 10_000)
    assert len(out) == 10_000 - (scrubber.max_form_length - 1)
    assert stream.flush() == b"z" * (scrubber.max_form_length - 1)


def test_a_streamed_100_mib_body_is_scrubbed_in_flat_memory(scrubber: Scrubber) -> None:
    chunk_size = 64 * 1024
    filler = (b"lorem ipsum dolor sit amet " * 3000)[: chunk_size - len(SB) - 5]
    # Each chunk ends with the first half of the secret and the next begins with the rest.
    half = len(SB) // 2
    chunk = SB[half:] + b" " + filler + b" " + SB[:half]
    total = 100 * 1024 * 1024
    count = total // len(chunk)
    stream = scrubber.stream()
    tracemalloc.start()
    try:
        started = time.perf_counter()
        sent = 0
        leaked = 0
        for _ in range(count):
            out = stream.feed(chunk)
            sent += len(out)
            leaked += out.count(SB)
        sent += len(stream.flush())
        elapsed = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert leaked == 0
    # Every chunk boundary splits one secret: count - 1 of them are whole in the stream.
    assert sent == count * len(chunk) - (count - 1) * (len(SB) - len(P))
    # A chunk in, a chunk out, the joined pieces and the tail: a few chunks, never the body.
    assert peak < 6 * chunk_size, peak
    assert elapsed < 20, elapsed


def test_the_longest_secret_wins_where_one_contains_another() -> None:
    short, long = "abcdefgh-0123", "abcdefgh-0123-and-more"
    scrubber = Scrubber([(Secret(short), P), (Secret(long), Q)])
    assert scrubber.scrub(f"{long} {short}".encode()) == f"{Q} {P}".encode()
