"""The Secret type never shows its value: repr, str, format, exceptions, logs, pickles."""

from __future__ import annotations

import copy
import logging
import pickle

import pytest
import structlog
from structlog.testing import capture_logs

from sandgate.brokers import Secret
from sandgate.brokers.secret import REDACTED

VALUE = "hunter2-super-secret-value"


@pytest.mark.parametrize(
    "render",
    [
        repr,
        str,
        lambda s: f"{s}",
        lambda s: f"{s!r}",
        lambda s: f"{s:>40}",
        lambda s: "%s" % s,  # noqa: UP031 (the form under test)
        lambda s: "%r" % s,  # noqa: UP031
        lambda s: str.format("{}", s),
        lambda s: str([s, {"k": s}]),
        lambda s: repr((s,)),
    ],
    ids=[
        "repr is redacted",
        "str is redacted",
        "an f-string is redacted",
        "an f-string with !r is redacted",
        "a format spec is ignored",
        "percent-s is redacted",
        "percent-r is redacted",
        "str.format is redacted",
        "inside a list or dict it is redacted",
        "inside a tuple repr it is redacted",
    ],
)
def test_secret_renders_redacted(render: object) -> None:
    text = render(Secret(VALUE))  # type: ignore[operator]
    assert VALUE not in text
    assert REDACTED in text


def test_reveal_is_the_way_to_the_value() -> None:
    secret = Secret(VALUE)
    assert secret.reveal() == VALUE
    assert secret.reveal_bytes() == VALUE.encode()
    assert Secret(b"\xffraw").reveal_bytes() == b"\xffraw"


def test_secrets_compare_by_value_and_not_with_plain_strings() -> None:
    assert Secret(VALUE) == Secret(VALUE)
    assert Secret(VALUE) != Secret(VALUE + "x")
    assert Secret(VALUE) != VALUE
    assert (Secret(VALUE) == VALUE) is False


def test_a_secret_is_unhashable() -> None:
    with pytest.raises(TypeError):
        hash(Secret(VALUE))


@pytest.mark.parametrize(
    "protocol", range(pickle.HIGHEST_PROTOCOL + 1), ids=lambda p: f"pickle protocol {p} is refused"
)
def test_a_secret_cannot_be_pickled(protocol: int) -> None:
    with pytest.raises(TypeError, match="cannot be pickled") as info:
        pickle.dumps({"x": Secret(VALUE)}, protocol=protocol)
    assert VALUE not in str(info.value)


def test_copies_are_the_same_object() -> None:
    secret = Secret(VALUE)
    assert copy.copy(secret) is secret
    assert copy.deepcopy({"s": secret})["s"] is secret


def test_an_exception_carrying_a_secret_does_not_show_it() -> None:
    error = ValueError("bad credential", Secret(VALUE))
    assert VALUE not in str(error)
    assert VALUE not in repr(error)


def test_logging_and_structlog_never_see_the_value(caplog: pytest.LogCaptureFixture) -> None:
    secret = Secret(VALUE)
    with caplog.at_level(logging.DEBUG):
        logging.getLogger("sandgate.test").warning("secret is %s / %r", secret, secret, extra={"s": secret})
        with capture_logs() as events:
            structlog.get_logger("sandgate.test").warning("event", secret=secret, nested={"s": secret})
    assert VALUE not in caplog.text
    assert VALUE not in repr(events)
    rendered = structlog.processors.JSONRenderer(default=repr)(None, "warning", dict(events[0]))
    assert VALUE not in str(rendered)


def test_only_str_or_bytes_are_secrets() -> None:
    with pytest.raises(TypeError):
        Secret(123)  # type: ignore[arg-type]
