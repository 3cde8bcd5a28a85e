"""sandgate proxy: the mitmproxy side. `runtime` builds the master and its addons in pipeline
order from the subsystems `assembly/` builds; `front/` passes allowed TLS tunnels through
before mitmproxy's layers, `lean/` serves intercepted HTTP/1.1 without mitmproxy's HTTP layer
(the same hooks), `addons/` are the hooks, `mitm/` what sandgate changes inside
mitmproxy, `net/` host plumbing, `dns/` the guests' DNS, `audit/` the trail, `stores/`
credential and sandbox stores, `fleet/` fleet sync, `redis/` the redis client and its outage
state, `admin/` the admin API, `workers/` the supervisor of N gateway processes and `cli/`
the `sandgate` command; `console/` is the operator's web pages, served by the admin API.
"""

# The public modules, named but not imported: re-exporting their names here would make any
# import under sandgate.proxy (the CLI's too) run the runtime and mitmproxy first, in an order
# that breaks as soon as two sub-packages import each other's names through their packages.
__all__ = [
    "addons",
    "admin",
    "approvals",
    "assembly",
    "audit",
    "cli",
    "config",
    "connection_table",
    "console",
    "context",
    "dns",
    "errors",
    "fleet",
    "front",
    "lean",
    "metrics",
    "mitm",
    "net",
    "redis",
    "refresh",
    "respond",
    "runtime",
    "sandboxes",
    "startup",
    "state",
    "stores",
    "tasks",
    "version",
    "worker_role",
    "workers",
]
