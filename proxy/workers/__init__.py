"""A gateway on every core: a supervisor that runs N gateway processes (workers) and keeps them up.

`sandgate run --workers N` (N > 1) runs `supervisor.Supervisor`, which imports no mitmproxy: it
checks every address first, makes the CA and keys once, re-executes `sandgate run` N times with
`SANDGATE_WORKER=i/N` (proxy/worker_role.py), restarts a worker that dies, forwards SIGHUP,
SIGTERM and SIGINT, and writes the gateway's status file once every worker serves.
"""

__all__ = ["child", "count", "gateway_status", "prepare", "services", "supervisor"]
