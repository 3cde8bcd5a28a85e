"""4002 HTTP Activity: a request-phase decision (activity from the method)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sandgate.proxy.audit.ocsf.activity import NETWORK, network_event
from sandgate.proxy.audit.ocsf.base import OcsfClass

__all__ = ["HTTP_ACTIVITY", "http_activity"]

HTTP_ACTIVITY = OcsfClass(4002, "HTTP Activity", *NETWORK)
_METHODS = {
    "CONNECT": 1,
    "DELETE": 2,
    "GET": 3,
    "HEAD": 4,
    "OPTIONS": 5,
    "POST": 6,
    "PUT": 7,
    "TRACE": 8,
    "PATCH": 9,
}
_TCP = {"direction_id": 2, "direction": "Outbound", "protocol_name": "tcp", "protocol_num": 6}


def _activity(method: str) -> tuple[int, str]:
    if not method:
        return 0, "Unknown"
    uid = _METHODS.get(method)
    # A method OCSF names has its caption (`Get`); another one is named as sent.
    return (uid, method.capitalize()) if uid is not None else (99, method)


def http_activity(record: Mapping[str, Any], uid: str) -> dict[str, Any]:
    """The event of one request's decision: `http_request` (method, url with the query values
    redacted as recorded) and `http_response` (status) when the guest got one."""
    method = str(record.get("method") or "")
    event = network_event(record, HTTP_ACTIVITY, _activity(method), uid, mapped=("method", "path"))
    request: dict[str, Any] = {}
    if method in _METHODS:
        request["http_method"] = method
    elif method:
        # OCSF's http_method names nine methods; another one (WebDAV's) stays as sent.
        event.setdefault("unmapped", {})["method"] = method
    url = _url(record)
    if url:
        request["url"] = url
    event["http_request"] = request
    if isinstance(record.get("status"), int):
        event["http_response"] = {"code": record["status"]}
    event["connection_info"] = dict(_TCP)
    return event


def _url(record: Mapping[str, Any]) -> dict[str, Any] | None:
    path = record.get("path")
    if path is None:
        return None
    base, sep, query = str(path).partition("?")
    url: dict[str, Any] = {"path": base}
    if sep:
        url["query_string"] = query
    dest = record.get("dest")
    if isinstance(dest, Mapping):
        if dest.get("host"):
            url["hostname"] = str(dest["host"])
        if isinstance(dest.get("port"), int):
            url["port"] = dest["port"]
    return url
