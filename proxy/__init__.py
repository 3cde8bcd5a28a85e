"""sandgate proxy: the mitmproxy side. `runtime` builds the master and its addons in pipeline
order; `addons/` are the hooks, `mitm/` what sandgate changes inside mitmproxy, `net/` host
plumbing, `audit/` the trail, `stores/` credential and sandbox stores, `fleet/` redis sync,
`admin/` the admin API and `cli/` the `sandgate` command.
"""
