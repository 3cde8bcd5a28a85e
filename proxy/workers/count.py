"""How many workers a gateway runs: the command line, the config, $SANDGATE_WORKERS, the cores."""

from __future__ import annotations

import os
from collections.abc import Mapping

from sandgate.proxy.config import GatewayConfig
from sandgate.proxy.errors import ConfigError

__all__ = ["ENV_COUNT", "cores", "worker_count"]

# The default count when neither the command line nor the config gives one (tests set it).
ENV_COUNT = "SANDGATE_WORKERS"


def cores() -> int:
    """The cores this process may run on (its CPU affinity, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def worker_count(cli: int | None, config: GatewayConfig, env: Mapping[str, str] = os.environ) -> int:
    """--workers, else the config's workers.count, else $SANDGATE_WORKERS, else one per core;
    "auto" in either place is one per core. ConfigError for a $SANDGATE_WORKERS that is no count."""
    if cli is not None:
        return cli
    configured = config.workers.count
    if configured is None:
        text = env.get(ENV_COUNT, "").strip()
        if not text:
            return cores()
        if text == "auto":
            return cores()
        if not text.isdigit() or int(text) < 1:
            raise ConfigError(f"${ENV_COUNT} must be a count of at least 1 or 'auto', not {text!r}")
        return int(text)
    return cores() if configured == "auto" else configured
