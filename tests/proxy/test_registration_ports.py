"""Which ports `sandbox add`, `jail` and the gateway's host rules steer to: every worker's
(transparent, DNS) pair when the config gives both listeners fixed ports, learned from the
status file's "workers" (written by the supervisor); the lead's pair alone for listeners opened
on demand, which only the lead has."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import write_gateway_files

from sandgate.proxy.config import GatewayConfig, for_worker, load_config
from sandgate.proxy.errors import ConfigError
from sandgate.proxy.sandboxes.registration import gateway_ports, listener_ports
from sandgate.proxy.state.statusfile import write_status
from sandgate.proxy.worker_role import WorkerRole

T, D = 18081, 18053


def _config(tmp_path: Path, *, listeners: bool = True, **more: Any) -> GatewayConfig:
    extra: dict[str, Any] = dict(more)
    if listeners:
        extra |= {
            "listeners": [
                {"host": "127.0.0.1", "port": 18080},
                {"mode": "transparent", "host": "0.0.0.0", "port": T},
            ],
            "dns": {"host": "0.0.0.0", "port": D},
        }
    path, _ = write_gateway_files(tmp_path, {}, config=extra)
    return load_config(path)


def test_without_a_running_gateway_the_configs_ports_for_one_worker(tmp_path: Path) -> None:
    assert listener_ports(_config(tmp_path)) == [(T, D)]


def test_a_running_single_gateway_has_one_pair(tmp_path: Path) -> None:
    config = _config(tmp_path)
    write_status(config.status_path, {"transparent_port": T, "dns_port": D})
    assert listener_ports(config) == [(T, D)]


@pytest.mark.parametrize("workers", [2, 3])
def test_the_status_files_worker_count_gives_every_workers_pair(tmp_path: Path, workers: int) -> None:
    config = _config(tmp_path)
    write_status(config.status_path, {"transparent_port": T, "dns_port": D, "workers": workers})
    assert listener_ports(config) == [(T + i, D + i) for i in range(workers)]


def test_listeners_opened_on_demand_are_the_leads_alone(tmp_path: Path) -> None:
    """A config without a transparent and DNS listener: the jail's listeners exist on the lead
    only, so every interface goes to its ports whatever the number of workers."""
    config = _config(tmp_path, listeners=False)
    write_status(
        config.status_path,
        {"transparent_port": 40001, "dns_port": 40002, "workers": 2, "opened_on_demand": ["x"]},
    )
    assert listener_ports(config) == [(40001, 40002)]


def test_no_listeners_and_no_gateway_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs a transparent listener and a dns listener"):
        listener_ports(_config(tmp_path, listeners=False))


def test_a_single_gateway_process_steers_to_its_own_ports(tmp_path: Path) -> None:
    assert gateway_ports(_config(tmp_path), T, D) == [(T, D)]


def test_without_a_running_gateway_the_configured_count(tmp_path: Path) -> None:
    """`sandbox add` before the gateway runs: its configured count (the gateway rewrites the
    table with the count it serves with when it starts)."""
    assert listener_ports(_config(tmp_path, workers={"count": 3})) == [(T + i, D + i) for i in range(3)]
    assert listener_ports(_config(tmp_path / "auto", workers={"count": "auto"})) == [(T, D)]


@pytest.mark.parametrize("index", [0, 1, 2])
def test_a_worker_derives_every_workers_ports_from_its_own(tmp_path: Path, index: int) -> None:
    worker = for_worker(_config(tmp_path), WorkerRole(index, 3))
    own = (T + index, D + index)
    assert (worker.listeners[1].port, worker.dns.port if worker.dns else None) == own
    assert gateway_ports(worker, *own) == [(T + i, D + i) for i in range(3)]


def test_the_lead_registering_reads_its_own_status_and_knows_the_count(tmp_path: Path) -> None:
    """The lead's admin API registers with the lead's config: its own status file has no
    "workers" (the supervisor adds it to the gateway's), its config has the count."""
    lead = for_worker(_config(tmp_path), WorkerRole(0, 2))
    write_status(lead.status_path, {"transparent_port": T, "dns_port": D})
    assert listener_ports(lead) == [(T, D), (T + 1, D + 1)]
