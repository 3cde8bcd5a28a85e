"""`sandgate run`: the gateway, from a config file and the command line's overrides.

One worker (`--workers 1`, or a one-core host): the gateway runs in this process. More: this
process becomes the supervisor (proxy/workers/supervisor.py) of that many gateway processes,
each `sandgate run` again with `SANDGATE_WORKER=i/N` in its environment. Either holds the
state folder's lock (proxy/state/state_lock.py) from before it touches the folder until it exits.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sandgate.policy.errors import PolicySetError
from sandgate.proxy.config import GatewayConfig, for_worker, load_config
from sandgate.proxy.errors import ConfigError, ListenerError, StateDirInUse
from sandgate.proxy.mitm.lean_import import skip_default_addons
from sandgate.proxy.startup.logsetup import configure_logging
from sandgate.proxy.state.state_lock import hold
from sandgate.proxy.worker_role import WorkerRole

if TYPE_CHECKING:
    from sandgate.proxy.workers.services import SharedServices

__all__ = ["run_command", "with_proxy_port", "worker_argv"]

EXIT_FAILED, EXIT_USAGE = 1, 2


def run_command(args: argparse.Namespace) -> int:
    """Serve until stopped; 2 for an invalid policy, 1 for a listener that cannot start."""
    config = load_config(args.config)
    if args.strict:
        config = config.model_copy(update={"strict_policy": True})
    if args.port is not None:
        config = with_proxy_port(config, args.port, args.config)
    configure_logging(config.log.level, config.log.format)
    role = WorkerRole.from_env()
    if role.count > 1:
        return _serve_worker(for_worker(config, role))
    # Lazy: the count needs no runtime, and a supervisor never loads it (nor mitmproxy).
    from sandgate.proxy.workers.count import worker_count

    count = worker_count(getattr(args, "workers", None), config)
    # Before anything touches the state folder (CA, keys, a stale limit relay it would stop).
    # Never let go: the kernel does when this process (the supervisor, or the gateway itself)
    # has exited, so `sandgate stop`, waiting for the lock, returns only once it is gone.
    try:
        hold(config.state_path)
    except StateDirInUse as e:
        print(f"sandgate: {e}", file=sys.stderr)
        return EXIT_FAILED
    if count > 1:
        return _supervise(args, config, count)
    return _serve(config)


def _serve(config: GatewayConfig) -> int:
    """The gateway in this process (one worker, as sandgate always ran)."""
    skip_default_addons()  # before anything imports mitmproxy.addons
    # Lazy: the runtime loads mitmproxy, which a supervisor never needs.
    from sandgate.proxy.runtime import serve

    try:
        return asyncio.run(serve(config))
    except PolicySetError as e:
        print(f"sandgate: the policy is invalid, not starting:\n{e}", file=sys.stderr)
        return EXIT_USAGE
    except ListenerError as e:
        print(f"sandgate: {e}", file=sys.stderr)
        return EXIT_FAILED


def _serve_worker(config: GatewayConfig) -> int:
    """One worker under a supervisor: a listener it cannot bind is left for the supervisor to
    report (once, not once per attempt)."""
    skip_default_addons()  # before anything imports mitmproxy.addons
    # Lazy: the runtime loads mitmproxy, which a supervisor never needs.
    from sandgate.proxy.runtime import serve
    from sandgate.proxy.workers.child import bind_to_supervisor, leave_start_failure

    bind_to_supervisor()
    try:
        return asyncio.run(serve(config))
    except PolicySetError as e:
        print(f"sandgate: the policy is invalid, not starting:\n{e}", file=sys.stderr)
        return EXIT_USAGE
    except ListenerError as e:
        leave_start_failure(config, str(e))
        return EXIT_FAILED


def _supervise(args: argparse.Namespace, config: GatewayConfig, count: int) -> int:
    """Check, prepare and run `count` workers under this process."""
    # Lazy: a gateway of one worker needs none of the supervisor.
    from sandgate.proxy.workers.prepare import check_all_endpoints, free_port, make_shared_files
    from sandgate.proxy.workers.services import SharedServices
    from sandgate.proxy.workers.supervisor import Supervisor

    port = args.port
    explicit = [lst for lst in config.listeners if lst.mode == "regular"]
    if len(explicit) == 1 and explicit[0].port == 0:
        # "Any free port": the workers must agree on one, so the supervisor picks it.
        port = free_port(explicit[0].host)
        config = with_proxy_port(config, port, args.config)
    try:
        check_all_endpoints(config, count)
    except ListenerError as e:
        print(f"sandgate: {e}", file=sys.stderr)
        return EXIT_FAILED
    make_shared_files(config)
    argv = worker_argv(args.config, port, strict=args.strict)
    try:
        services = SharedServices(config).start()
    except ListenerError as e:
        print(f"sandgate: {e}", file=sys.stderr)
        return EXIT_FAILED
    with services:
        env = {**os.environ, **services.env()}
        supervisor = Supervisor(
            config, count, argv, env=env, settle=services.settle, stopping=lambda: _stopping(services)
        )
        return asyncio.run(supervisor.run())


def _stopping(services: SharedServices) -> None:
    """The gateway stops: its limit relay's exit from now on is expected, not restarted."""
    if services.limit_relay is not None:
        services.limit_relay.gateway_stopping()


def worker_argv(config_path: Path | None, port: int | None, *, strict: bool) -> list[str]:
    """The command line a worker runs: this `sandgate run`, without --workers."""
    argv = [sys.executable, "-m", "sandgate.proxy.cli.main", "run"]
    if config_path is not None:
        argv += ["--config", str(config_path.resolve())]
    if port is not None:
        argv += ["--port", str(port)]
    if strict:
        argv.append("--strict")
    return argv


def with_proxy_port(config: GatewayConfig, port: int, source: Path | None) -> GatewayConfig:
    """The config with its explicit proxy listener on `port`; ConfigError when that is not one
    listener (the transparent listeners keep their ports: the host's nftables redirect to them)."""
    explicit = [i for i, lst in enumerate(config.listeners) if lst.mode == "regular"]
    where = source or "the embedded defaults"
    if len(explicit) != 1:
        found = "none" if not explicit else f"{len(explicit)}"
        raise ConfigError(
            f"--port sets the port of the one explicit proxy listener (mode: regular); {where} "
            f"has {found}: set the ports under listeners: instead"
        )
    listeners = list(config.listeners)
    listeners[explicit[0]] = listeners[explicit[0]].model_copy(update={"port": port})
    return config.model_copy(update={"listeners": listeners})
