"""What the lead worker asks its peers, so the admin API answers for the whole gateway.

Changes (a reload, a registry change, a credential change) go to every peer and count as
done on a peer only when it confirmed; reads (/metrics, /v1/status) show what the peers that
answered in time said, and which did not. Peers serve these `/internal/v1/...` routes on
their private sockets only (proxy/admin/handlers.py).
"""

from __future__ import annotations

import os
from typing import Any, Literal

import structlog
from prometheus_client.core import GaugeMetricFamily

from sandgate.proxy.admin.metrics_merge import merge_expositions, render
from sandgate.proxy.admin.peers import READ_TIMEOUT, WRITE_TIMEOUT, PeerAnswer, Peers
from sandgate.proxy.admin.state import AdminState
from sandgate.proxy.metrics import METRICS

__all__ = [
    "RELOAD_PATH",
    "confirm_reload",
    "failed",
    "gateway_metrics",
    "invalidate_credentials",
    "reload_peers",
    "worker_view",
    "workers_status",
]

RELOAD_PATH = "/internal/v1/reload"
CREDENTIALS_PATH = "/internal/v1/credentials-changed"
WORKER_PATH = "/internal/v1/worker"
METRICS_PATH = "/internal/v1/metrics"

What = Literal["policy", "registry"]

log = structlog.get_logger("sandgate.admin")


def worker_view(state: AdminState) -> dict[str, Any]:
    """This worker as /v1/status lists it."""
    return {
        "index": state.role.index,
        "pid": os.getpid(),
        "ready": state.ready(),
        "policy_version": state.ctx.policy.version,
        "answered": True,
    }


def failed(answers: list[PeerAnswer]) -> str | None:
    """One line naming the peers that did not confirm, or None when all did."""
    errors = [a.error or f"worker {a.index} failed" for a in answers if not a.ok]
    return "; ".join(errors) if errors else None


def _peers(state: AdminState) -> Peers:
    assert state.peers is not None
    return state.peers


async def reload_peers(
    state: AdminState, what: What, trigger: str, lead_ok: bool, *, if_changed: bool = False
) -> tuple[list[dict[str, Any]], list[PeerAnswer]]:
    """Reload every peer (its policy, or its copy of the registry; `if_changed`: unless it
    already loaded the files on disk); each worker's result."""
    answers = await _peers(state).call(
        "POST",
        RELOAD_PATH,
        within=WRITE_TIMEOUT,
        json={"what": what, "trigger": trigger, "if_changed": if_changed},
    )
    results = [{"index": state.role.index, "ok": lead_ok, "policy_version": state.ctx.policy.version}]
    for a in answers:
        entry = a.view()
        version = a.body.get("policy_version")
        if isinstance(version, str):
            entry["policy_version"] = version
        if a.body.get("errors"):
            entry["errors"] = [str(e) for e in a.body["errors"]][:10]
        results.append(entry)
    return results, answers


# Triggers every worker sees itself: a peer that already loaded the files on disk is not
# asked to load them again. Any other (an operator's API call) reloads every peer outright.
SEEN_BY_EVERY_WORKER = frozenset({"file_change", "sighup"})


async def confirm_reload(state: AdminState, trigger: str, lead_ok: bool) -> list[dict[str, Any]]:
    """After the lead reloaded: each peer loads the same files (on a change every worker saw,
    unless it already did); each worker's result, for the answer and the one audit record."""
    if_changed = trigger in SEEN_BY_EVERY_WORKER
    results, answers = await reload_peers(state, "policy", trigger, lead_ok, if_changed=if_changed)
    problem = failed(answers)
    if problem is not None:
        log.warning("policy.reload_not_confirmed", trigger=trigger, workers=problem)
    return results


async def invalidate_credentials(state: AdminState) -> list[PeerAnswer]:
    """Every peer drops its cached stored credentials (it reads the store again on next use)."""
    return await _peers(state).call("POST", CREDENTIALS_PATH, within=WRITE_TIMEOUT)


async def workers_status(state: AdminState) -> list[dict[str, Any]]:
    """Every worker: index, pid, ready, policy version, or that it did not answer."""
    out = [worker_view(state)]
    for a in await _peers(state).call("GET", WORKER_PATH, within=READ_TIMEOUT):
        if a.ok:
            out.append({**a.body, "index": a.index, "answered": True})
        else:
            out.append({"index": a.index, "answered": False, "ready": False, "error": a.error})
    return out


async def gateway_metrics(state: AdminState) -> bytes:
    """One exposition for the gateway: this worker's and the peers' that answered, merged."""
    texts = [METRICS.exposition().decode()]
    ready = int(state.ready())
    for a in await _peers(state).call("GET", METRICS_PATH, within=READ_TIMEOUT):
        text, worker = a.body.get("exposition"), a.body.get("worker")
        if not a.ok or not isinstance(text, str):
            continue
        texts.append(text)
        ready += int(isinstance(worker, dict) and worker.get("ready") is True)
    families = merge_expositions(texts)
    families.append(
        GaugeMetricFamily("sandgate_workers", "Worker processes of this gateway", state.role.count)
    )
    families.append(
        GaugeMetricFamily(
            "sandgate_workers_ready",
            "Workers that answered this scrape in time and serve (listeners bound)",
            ready,
        )
    )
    return render(families)
