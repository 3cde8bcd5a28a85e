"""The network endpoints of an event: the guest (`src_endpoint`), where it asked to go
(`dst_endpoint`) and the gateway's listener that took the connection (`proxy_endpoint`)."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

__all__ = ["dst_endpoint", "listener_endpoint", "src_endpoint"]


@lru_cache(maxsize=4096)
def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


@lru_cache(maxsize=4096)
def _address(text: str) -> tuple[str | None, int | None]:
    """(ip, port) of `ip:port`, `[v6]:port`, a bare `port` or `ip`; (None, None) for `-`."""
    host, port = text, None
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest.removeprefix(":") or None
    elif text.count(":") == 1:
        host, port = text.split(":")
    elif text.isdigit():
        host, port = "", text
    ip = host if host and _is_ip(host) else None
    return ip, int(port) if port and port.isdigit() and int(port) <= 65535 else None


def src_endpoint(record: Mapping[str, Any]) -> dict[str, Any] | None:
    """The guest: its address and port, named by its sandbox."""
    ip, port = _address(str(record.get("client") or "-"))
    out: dict[str, Any] = {}
    if ip is not None:
        out["ip"] = ip
    if port is not None:
        out["port"] = port
    if record.get("sandbox"):
        out["name"] = str(record["sandbox"])
    # OCSF wants a name, an ip or a uid (among others): a port alone is no endpoint.
    return out if "ip" in out or "name" in out else None


def dst_endpoint(record: Mapping[str, Any]) -> dict[str, Any] | None:
    """The destination: the name asked for, the address the gateway pinned, the port."""
    dest = record.get("dest")
    if not isinstance(dest, Mapping):
        return None
    host, ip, port = dest.get("host"), dest.get("ip"), dest.get("port")
    out: dict[str, Any] = {}
    if host:
        # An IP literal destination is an address, not a name.
        out["ip" if _is_ip(str(host)) and not ip else "hostname"] = str(host)
    if ip:
        out["ip"] = str(ip)
    if not out:
        return None
    if isinstance(port, int):
        out["port"] = port
    return out


@lru_cache(maxsize=256)
def _listener(listener: str) -> tuple[tuple[str, Any], ...]:
    mode, _, where = listener.partition("@")
    ip, port = _address(where) if where else (None, None)
    out: list[tuple[str, Any]] = [("name", listener), ("svc_name", mode)]
    if ip is not None:
        out.append(("ip", ip))
    if port is not None:
        out.append(("port", port))
    return tuple(out)


def listener_endpoint(record: Mapping[str, Any]) -> dict[str, Any] | None:
    """The gateway's listener (`regular@127.0.0.1:8080`, `transparent@8081`, `dns@...`)."""
    listener = record.get("listener")
    return dict(_listener(str(listener))) if listener else None
