"""Where sinks keep their queues, and their figures as /metrics reads them.

One process reads its sinks' counts directly. With workers the sinks run in the supervisor
(the one writer), which serves no /metrics: each sink writes `figures.json` beside its queue
(about once a second) and the lead worker reads those files, so the gateway's merged
/metrics counts each sink once.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol

from sandgate.proxy.config import GatewayConfig
from sandgate.proxy.metrics import SinkFigures

__all__ = ["DELIVERY_FILE", "FIGURES_FILE", "gateway_sink_figures", "read_figures", "sink_folder"]

FIGURES_FILE = "figures.json"
# What a courier process delivered of a one-process gateway's queue (courier.py).
DELIVERY_FILE = "delivery.json"


class _HasFigures(Protocol):
    def figures(self) -> SinkFigures: ...


def sink_folder(config: GatewayConfig, name: str) -> Path:
    """`<state_dir>/audit/sinks/<name>/`: the sink's queue, cursor and figures."""
    return config.state_path / "audit" / "sinks" / name


def read_figures(config: GatewayConfig) -> list[SinkFigures]:
    """The configured sinks' figures as their files say (a sink without one: zeros)."""
    out = []
    for sink in config.audit.sinks:
        folder = sink_folder(config, sink.name)
        try:
            data = json.loads((folder / FIGURES_FILE).read_text())
            data.update(_delivered(folder))
            out.append(SinkFigures(**{**data, "name": sink.name, "kind": sink.type}))
        except (OSError, ValueError, TypeError):
            out.append(SinkFigures(sink.name, sink.type, 0, 0, 0, 0, 0, 0, 0.0))
    return out


def _delivered(folder: Path) -> dict[str, float]:
    """A courier's own counts (fresher than the gateway's figures file, which it wrote when
    records last came); {} without a courier."""
    try:
        sent = json.loads((folder / DELIVERY_FILE).read_text())
        return {key: sent[key] for key in ("delivered", "retried", "rejected")}
    except (OSError, ValueError, TypeError, KeyError):
        return {}


def gateway_sink_figures(config: GatewayConfig, live: Sequence[_HasFigures]) -> Iterable[SinkFigures]:
    """What this process reports: its own sinks, or (the lead of several workers) the
    supervisor's from their files; the other workers none."""
    if config.worker.count == 1:
        return [s.figures() for s in live]
    return read_figures(config) if config.worker.lead else []
