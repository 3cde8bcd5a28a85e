"""How many workers, and what each worker's config is (proxy/workers/count.py, config.for_worker)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandgate.proxy.config import GatewayConfig, ListenerConfig, for_worker
from sandgate.proxy.errors import ConfigError
from sandgate.proxy.worker_role import WorkerRole
from sandgate.proxy.workers.count import ENV_COUNT, cores, worker_count


def config(count: int | str | None = None) -> GatewayConfig:
    return GatewayConfig.model_validate({"workers": {"count": count}, "state_dir": "/srv/sg"})


@pytest.mark.parametrize(
    ("cli", "configured", "env", "expected"),
    [
        (3, 2, "5", 3),
        (None, 2, "5", 2),
        (None, None, "5", 5),
        (None, None, "", "cores"),
        (None, "auto", "5", "cores"),
        (None, None, "auto", "cores"),
        (1, "auto", "5", 1),
    ],
    ids=[
        "--workers wins over the config and the environment",
        "the config's count wins over the environment",
        "the environment is the default when neither says",
        "with nothing set it is one per core",
        "auto in the config is one per core whatever the environment says",
        "auto in the environment is one per core",
        "--workers 1 runs the gateway alone",
    ],
)
def test_the_count_follows_its_precedence(
    cli: int | None, configured: int | str | None, env: str, expected: int | str
) -> None:
    want = cores() if expected == "cores" else expected
    assert worker_count(cli, config(configured), {ENV_COUNT: env}) == want


def test_cores_is_this_process_affinity() -> None:
    assert cores() == len(os.sched_getaffinity(0))


@pytest.mark.parametrize("env", ["0", "two", "-1"], ids=["zero", "a word", "negative"])
def test_a_bad_environment_count_is_a_config_error(env: str) -> None:
    with pytest.raises(ConfigError, match=ENV_COUNT):
        worker_count(None, config(), {ENV_COUNT: env})


def test_a_config_count_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match=r"workers\.count"):
        config(0)


def test_one_worker_keeps_the_config_as_it_is() -> None:
    base = config()
    assert for_worker(base, WorkerRole()) is base
    assert base.status_path == Path("/srv/sg/gateway.json")
    assert base.admin_socket_path == Path("/srv/sg/admin.sock")
    assert base.stream_spool_path == Path("/srv/sg/audit/stream.spool")
    assert base.fleet_epoch_path == Path("/srv/sg/fleet-epoch")
    assert base.worker_suffix == ""


def test_each_worker_has_its_own_ports_files_and_admin_socket() -> None:
    base = GatewayConfig.model_validate(
        {
            "state_dir": "/srv/sg",
            "listeners": [{"port": 3128}, {"mode": "transparent", "port": 8081}],
            "dns": {"port": 8053},
            "admin": {"listen": "127.0.0.1:9180", "token": "env:T"},
        }
    )
    lead, peer = for_worker(base, WorkerRole(0, 3)), for_worker(base, WorkerRole(2, 3))
    # The explicit port is shared (SO_REUSEPORT); transparent and DNS are base + index.
    assert peer.listeners == [
        ListenerConfig(port=3128),
        ListenerConfig(mode="transparent", port=8083),
    ]
    assert peer.dns is not None and peer.dns.port == 8055
    assert lead.dns is not None and lead.dns.port == 8053
    # The lead serves the gateway's admin socket and TCP listener; a peer a private socket.
    assert lead.admin_socket_path == Path("/srv/sg/admin.sock") and lead.admin.listen == "127.0.0.1:9180"
    assert peer.admin_socket_path == Path("/srv/sg/workers/w2.sock") and peer.admin.listen is None
    assert peer.status_path == Path("/srv/sg/workers/w2/gateway.json")
    assert peer.stream_spool_path == Path("/srv/sg/workers/w2/stream.spool")
    assert peer.fleet_epoch_path == Path("/srv/sg/workers/w2/fleet-epoch")
    assert peer.worker_suffix == "-w2"
    # What the workers share stays where it was.
    assert peer.ca_dir == base.ca_dir and peer.registry_path == base.registry_path
    assert peer.audit_path == base.audit_path and peer.nft_table == base.nft_table


def test_the_supervisor_loads_no_mitmproxy() -> None:
    code = (
        "import sys; import sandgate.proxy.workers.supervisor, sandgate.proxy.workers.prepare; "
        "import sandgate.proxy.cli.run; "
        "print(sorted(m for m in sys.modules if m.startswith('mitmproxy')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
