"""`audit.sinks` in the gateway config: the four types, their checks, credentials read from
their references (relative files against the config's folder) and never shown."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from sandgate.proxy.audit.sinks.build import build_sinks
from sandgate.proxy.config import ElasticsearchSinkConfig, GatewayConfig, load_config
from sandgate.proxy.errors import ConfigError

SECRET = "hec-secret-value-93b1f07c"  # looked for in reprs and errors

ALL_FOUR = """
audit:
  sinks:
    - {type: syslog, name: relay, host: 127.0.0.1, port: 6514, tls: {}, format: native}
    - {type: otlp, name: otel, url: "http://127.0.0.1:4318", secret_headers: {Authorization: "env:OTLP_AUTH"}}
    - {type: hec, name: splunk, url: "https://127.0.0.1:8088", token: "file:hec.token", when_full: block}
    - {type: elasticsearch, name: es, url: "http://127.0.0.1:9200/", index: audit-x}
"""


def load(tmp_path: Path, text: str) -> GatewayConfig:
    path = tmp_path / "sandgate.yaml"
    path.write_text(textwrap.dedent(text) + f"\nstate_dir: {tmp_path / 'state'}\n")
    return load_config(path)


def test_all_four_types_build_with_their_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTLP_AUTH", f"Bearer {SECRET}")
    token = tmp_path / "hec.token"
    token.write_text(SECRET + "\n")
    token.chmod(0o600)
    config = load(tmp_path, ALL_FOUR)
    relay, otel, splunk, es = config.audit.sinks
    assert (relay.format, otel.format, splunk.when_full, otel.when_full) == (
        "native",
        "ocsf",
        "block",
        "drop_newest",
    )
    assert isinstance(es, ElasticsearchSinkConfig) and es.url == "http://127.0.0.1:9200"  # no trailing /
    assert otel.max_spool_bytes == 1 << 30 and otel.linger_seconds == 1.0
    sinks = build_sinks(config)
    try:
        assert [s.name for s in sinks] == ["relay", "otel", "splunk", "es"]
        assert sinks[0].queue.folder == tmp_path / "state" / "audit" / "sinks" / "relay"
        shown = repr(config) + "".join(repr(s) + repr(vars(s.delivery)) for s in sinks)
        assert SECRET not in shown
    finally:
        for s in sinks:
            s.close()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "audit: {sinks: [{type: hec, name: a, url: 'http://x', token: 'env:T'},"
            " {type: otlp, name: a, url: 'http://y'}]}",
            "names must be unique (a)",
        ),
        ("audit: {sinks: [{type: otlp, name: a, url: 'http://u:p@x'}]}", "no credentials in the URL"),
        ("audit: {sinks: [{type: kafka, name: a}]}", "type"),
        ("audit: {sinks: [{type: otlp, name: 'A b', url: 'http://x'}]}", "name"),
        ("audit: {sinks: [{type: syslog, name: a, host: h, tls: {client_cert: c.pem}}]}", "go together"),
    ],
    ids=[
        "a name used twice",
        "credentials in a URL",
        "an unknown type",
        "a name that is no folder",
        "a cert without key",
    ],
)
def test_invalid_sinks_are_refused_at_load(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match="sinks") as e:
        load(tmp_path, text)
    assert message in str(e.value)


def test_a_missing_credential_names_the_sink_not_a_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NO_SUCH_TOKEN", raising=False)
    config = load(
        tmp_path, "audit: {sinks: [{type: hec, name: splunk, url: 'http://x', token: 'env:NO_SUCH_TOKEN'}]}"
    )
    with pytest.raises(
        ConfigError, match=r"audit.sinks\[splunk\].token: environment variable NO_SUCH_TOKEN is not set"
    ):
        build_sinks(config)


def test_a_credential_file_others_can_read_is_refused(tmp_path: Path) -> None:
    token = tmp_path / "hec.token"
    token.write_text(SECRET)
    token.chmod(0o644)
    config = load(
        tmp_path, "audit: {sinks: [{type: hec, name: s, url: 'http://x', token: 'file:hec.token'}]}"
    )
    with pytest.raises(ConfigError, match="chmod 600") as e:
        build_sinks(config)
    assert SECRET not in str(e.value)
