"""sandgate proxy: the mitmproxy side. `runtime` builds the master and its addons in pipeline
order from the subsystems `assembly/` builds; `front/` passes allowed TLS tunnels through
before mitmproxy's layers, `addons/` are the hooks, `mitm/` what sandgate changes inside
mitmproxy, `net/` host plumbing, `audit/` the trail, `stores/` credential and sandbox stores,
`fleet/` redis sync, `admin/` the admin API, `workers/` the supervisor of N gateway processes
and `cli/` the `sandgate` command.
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
    "banner",
    "bindcheck",
    "broker_setup",
    "ca",
    "cli",
    "config",
    "connection_table",
    "context",
    "errors",
    "fd_budget",
    "fleet",
    "front",
    "logsetup",
    "metrics",
    "mitm",
    "net",
    "registration",
    "reloader",
    "resolver_setup",
    "respond",
    "runtime",
    "sandbox_listing",
    "secret_refresh",
    "state_lock",
    "statusfile",
    "stores",
    "table_name",
    "tasks",
    "unix_sockets",
    "upstream_trust",
    "version",
    "worker_role",
    "workers",
]
