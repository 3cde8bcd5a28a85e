#!/usr/bin/env bash
# Set up what the tests need, then lint, type-check and run the whole suite.
# This is the command README.md gives and .ci/run calls. Needs root (network namespaces, nftables).
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install.sh --dev
echo "== ruff" >&2
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "== mypy" >&2
rm -rf .typecheck && mkdir -p .typecheck/sandgate
for pkg in proxy policy brokers; do ln -s "../../$pkg" ".typecheck/sandgate/$pkg"; done
MYPYPATH=.typecheck .venv/bin/mypy -p sandgate.proxy -p sandgate.policy -p sandgate.brokers
# The tests too: `tests/` is their import root (conftest, support), as pytest's pythonpath makes it.
MYPYPATH=.typecheck:tests .venv/bin/mypy --explicit-package-bases tests
echo "== pytest" >&2
# Two worker processes (pytest-xdist), a test file's tests on one of them (module fixtures such
# as a shared gateway start once): the end-to-end tests spend most of their time waiting, and
# every test is isolated (free ports, per-run names, per-state_dir nft tables). `-n 0` runs
# the suite in one process; later arguments win.
exec .venv/bin/python -m pytest -p no:cacheprovider -n 2 --dist loadfile "$@"
