"""Rego through the real gateway: the allowlist AND the tenant's Rego must allow."""

from __future__ import annotations

import shutil
import ssl
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import REPO, TOKEN_REF, GatewayFactory, RunningGateway
from support import RecordingUpstream

pytestmark = pytest.mark.slow

MODULE = """package sandgate.tenants.t1

import rego.v1

deny contains {"reason": "policy_denied", "message": "no deletes on this API"} if {
\tinput.phase == "request"
\tinput.request.method == "DELETE"
}

deny contains {"reason": "policy_denied", "message": "only the CI sandbox may push"} if {
\tinput.phase == "request"
\tinput.request.method == "POST"
\tinput.sandbox != "ci"
}
"""


@pytest.fixture
def gateway(start_gateway: GatewayFactory, https_upstream: RecordingUpstream) -> RunningGateway:
    tenant = yaml.safe_dump(
        {
            "tenant": "t1",
            "sandboxes": [{"id": "sb1", "token": TOKEN_REF}],
            "allow": [{"hosts": ["api.test"], "ports": [https_upstream.port], "inspect": True}],
            "rego": ["t1.rego"],
        }
    )

    def prepare(root: Path) -> None:
        (root / "rules" / "tenants" / "t1.rego").write_text(MODULE)
        shutil.copytree(REPO / "rules" / "rego", root / "rules" / "rego")

    return start_gateway({"t1.yaml": tenant}, prepare=prepare)


def test_rego_decides_each_request_after_the_allowlist(
    gateway: RunningGateway, https_upstream: RecordingUpstream
) -> None:
    base = https_upstream.url_for("api.test")
    with httpx.Client(
        proxy=gateway.proxy(), verify=ssl.create_default_context(cafile=str(gateway.ca_file)), timeout=10
    ) as c:
        get = c.get(f"{base}/items")
        delete = c.delete(f"{base}/items/1")
        post = c.post(f"{base}/items", json={})
    assert get.status_code == 200
    assert (delete.status_code, delete.headers["X-Sandgate-Reason"]) == (403, "policy_denied")
    assert delete.json()["message"] == "no deletes on this API"
    assert post.json()["message"] == "only the CI sandbox may push"
    assert [r.method for r in https_upstream.requests] == ["GET"]
    record = gateway.record(delete.json()["decision_id"])
    assert (record["reason"], record["decision"]) == ("policy_denied", "deny")
