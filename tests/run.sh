#!/usr/bin/env bash
# Set up what the tests need, then lint, type-check and run the whole suite.
# This is the command README.md gives and .ci/run calls. Needs root (network namespaces, nftables).
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install.sh --dev
echo "== ruff" >&2
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "== mypy (beside the tests below: its report follows theirs)" >&2
rm -rf .typecheck && mkdir -p .typecheck/sandgate
for pkg in proxy policy brokers; do ln -s "../../$pkg" ".typecheck/sandgate/$pkg"; done
typecheck_log=$(mktemp)
# One core for half a minute while the tests mostly wait on their gateways.
(
    set -e
    MYPYPATH=.typecheck .venv/bin/mypy -p sandgate.proxy -p sandgate.policy -p sandgate.brokers
    # The manual's reference generator (docs/tools: a script, outside the packages).
    MYPYPATH=.typecheck .venv/bin/mypy docs/tools/reference.py docs/tools/model_reference.py \
        docs/tools/cli_reference.py docs/tools/md_text.py
    # The tests too: `tests/` is their import root (conftest, support), as pytest's pythonpath makes it.
    MYPYPATH=.typecheck:tests .venv/bin/mypy --explicit-package-bases tests
) >"$typecheck_log" 2>&1 &
typecheck=$!
echo "== pytest" >&2
# The part run again with two workers per gateway (below). Not in it: tests/e2e/workers,
# tests/e2e/fleet/test_worker_limits.py and tests/e2e/test_hostnet_workers.py: each of their
# gateways sets its own count (`--workers 2`, SANDGATE_WORKERS=2 in its env, or SANDGATE_WORKER=i/2
# for one worker of two), so the first run already runs them with two workers, and a second run
# would only repeat them exactly.
WORKERS_SUBSET=(
    tests/e2e/addons/test_identify.py
    tests/e2e/test_runtime.py
    tests/e2e/test_audit_durability.py
    tests/e2e/addons/test_drain.py
    # The passthrough front in every worker: records, handoffs, refusals (its limits, caps and
    # drain file starts six gateways; it passes with two workers too, but is left to stage one).
    tests/e2e/front/test_front.py
    # Issue 23's refusals and streams with two workers: small-chunk streams through the
    # scrubber, a refused 101 with HTTP/2 behind it, TLS at the proxy port, h2 rapid reset.
    tests/e2e/addons/test_streamed_responses.py
    # MCP through the gateway: per-message decisions and list filtering hold in every worker.
    tests/e2e/addons/test_mcp_gateway.py
    # Tool-bound credentials and Rego per message in every worker (the WebSocket flood test
    # races its own close with two workers: left to stage one until it waits for the close).
    tests/e2e/addons/test_mcp_credentials.py
    tests/e2e/addons/test_mcp_rego.py
    tests/e2e/addons/test_upgrades.py::test_a_101_to_a_stripped_h2c_offer_in_a_tunnel_is_denied_as_upgrade_not_allowed
    tests/e2e/test_resources_conns.py::test_tls_sent_straight_to_the_proxy_port_is_audited_per_source_as_invalid_request
    tests/e2e/test_resources_conns.py::test_http2_rapid_reset_gets_goaway_and_other_tenants_stay_served
    # Fleet: two of the file's tests (the whole file takes 5 minutes with two workers).
    tests/e2e/test_fleet_registry.py::test_one_published_reload_is_in_force_on_both_gateways
    tests/e2e/test_fleet_registry.py::test_a_redis_replaced_by_an_empty_one_is_detected_loudly_and_fails_closed
)
# It asserts one process's metric: not yet written for a gateway of several workers.
WORKERS_SUBSET+=(
    --deselect tests/e2e/test_audit_durability.py::test_a_full_queue_denies_before_anything_goes_upstream
)
# The intercepted HTTP/1.1 exchanges again on mitmproxy's general HTTP layer: the suite above runs
# them on the lean layer (the default, proxy/lean/), which hands the general path only what it
# does not serve itself. Refusals of malformed traffic, head caps, streamed answers through the
# scrubber, trailers and hop-by-hop fields, credential injection and scrubbing, request decisions
# (Host, absolute-form targets, paths) and long streams on the path `interception.http1_path:
# general` keeps (tests/e2e/lean compares both paths exchange by exchange, and runs its limits,
# holds, redials and edge cases on both, in the run above; the in-process tests drive the addons
# through mitmproxy's layers). About 50 s.
GENERAL_PATH_SUBSET=(
    tests/e2e/addons/test_http_seam.py
    tests/e2e/addons/test_heads.py
    tests/e2e/addons/test_streamed_responses.py
    tests/e2e/addons/test_trailers.py
    tests/e2e/addons/test_hop_by_hop.py
    tests/e2e/addons/test_credentials.py
    tests/e2e/addons/test_gate.py
    tests/e2e/test_request_paths.py
    tests/e2e/addons/test_long_streams.py
)
# Two worker processes (pytest-xdist), a test file's tests on one of them (module fixtures such
# as a shared gateway or a namespace lab start once, and never run beside their own twin:
# `--dist worksteal` split test_transparent.py's lab and its jails hung once in six runs).
# The end-to-end tests spend most of their time waiting, and every test is isolated (free
# ports, per-run names, per-state_dir nft tables). `-n 0` runs the suite in one process;
# later arguments win.
status=0
# `--durations`: the slowest tests in every run's log, where CI time goes.
.venv/bin/python -m pytest -p no:cacheprovider -n 2 --dist loadfile --durations=30 "$@" || status=$?
# Every gateway above that does not set its count ran as one process (tests/conftest.py:
# SANDGATE_TEST_WORKERS, default 1).
# Then a representative end-to-end part again with two workers per gateway (a supervisor,
# SO_REUSEPORT, one audit writer, the limit relay): identity, reloads, audit, SIGTERM drain,
# fleet. Only on a whole run: with arguments (a selection), the run above is the one asked for.
if [ "$#" -eq 0 ]; then
    echo "== pytest, two workers per gateway" >&2
    SANDGATE_TEST_WORKERS=2 .venv/bin/python -m pytest -p no:cacheprovider -n 2 --dist loadfile \
        "${WORKERS_SUBSET[@]}" || status=$?
    echo "== pytest, the general HTTP/1.1 path" >&2
    SANDGATE_HTTP1_PATH=general .venv/bin/python -m pytest -p no:cacheprovider -n 2 --dist loadfile \
        "${GENERAL_PATH_SUBSET[@]}" || status=$?
fi
echo "== mypy" >&2
wait "$typecheck" || status=1
cat "$typecheck_log"
rm -f "$typecheck_log"
exit "$status"
