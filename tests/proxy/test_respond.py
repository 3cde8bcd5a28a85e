"""The gateway's own answers (proxy/respond.py and the refusals shaped like them): one JSON
object on one line, ended by a newline, so that `curl` leaves the shell prompt on its own line."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from mitmproxy import http

from sandgate.policy.decision import Decision
from sandgate.policy.reasons import Reason
from sandgate.proxy.addons.heads import refused_response
from sandgate.proxy.respond import (
    decision_response,
    denied_response,
    limited_response,
    proxy_auth_required,
    shutdown_response,
    upstream_error_response,
)

ID = "0190a1b2c3d4e5f60718293a"

ANSWERS: list[tuple[str, Callable[[], http.Response]]] = [
    ("a denial", lambda: denied_response(Reason.HOST_NOT_ALLOWED, "evil.test", ID)),
    ("a decision's denial", lambda: decision_response(Decision(reason=Reason.POLICY_DENIED), "api.test", ID)),
    ("an upstream failure", lambda: upstream_error_response(Reason.UPSTREAM_UNREACHABLE, "api.test", ID)),
    ("a rate limit", lambda: limited_response(Reason.RATE_LIMITED, "requests_per_minute", 7, "api.test", ID)),
    (
        "a body limit",
        lambda: limited_response(Reason.BODY_TOO_LARGE, "request_body_bytes", 0, "api.test", ID),
    ),
    ("a proxy credential request", lambda: proxy_auth_required(ID)),
    ("a refused request head", lambda: refused_response(431, Reason.HEADER_TOO_LARGE, ID, "head bytes")),
    ("a shutdown", lambda: shutdown_response(ID)),
]


@pytest.mark.parametrize(
    "make", [a[1] for a in ANSWERS], ids=[f"{a[0]} ends with a newline" for a in ANSWERS]
)
def test_a_json_answer_is_one_line_ended_by_a_newline(make: Callable[[], http.Response]) -> None:
    response = make()
    body = response.get_content()
    assert body is not None and body.endswith(b"}\n") and body.count(b"\n") == 1, body
    assert json.loads(body)["decision_id"] == ID
    assert response.headers["Content-Length"] == str(len(body))
