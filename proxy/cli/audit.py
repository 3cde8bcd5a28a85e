"""`sandgate audit tail|query|stats|suggest`: read the audit trail.

Exit codes: 0 ok (also when nothing matched), 2 usage or invalid input (a bad time, no audit
file). Malformed lines are skipped and counted on stderr. Output to a closed pipe ends quietly.
`tail --follow` ends on SIGINT or SIGTERM with exit 0, also when started as a background job
(which inherits SIGINT as ignored): stopping it is how it is meant to end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
from collections.abc import Iterable, Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from sandgate.proxy.audit.approval_stats import (
    GRANT_EVENT,
    ApprovalStats,
    approvals_document,
    approvals_table,
)
from sandgate.proxy.audit.files import JsonlSource, Source, audit_files
from sandgate.proxy.audit.format import json_line, ocsf_lines, table_header, table_row
from sandgate.proxy.audit.query import ANY_EVENT, AuditInputError, Query, Record, parse_time
from sandgate.proxy.audit.stats import collect as collect_stats
from sandgate.proxy.audit.stats import stats_document, stats_table
from sandgate.proxy.audit.stats_calls import call_stats_document, call_stats_table, collect_calls

if TYPE_CHECKING:
    from sandgate.proxy.audit.stream_source import StreamSource
    from sandgate.proxy.config import GatewayConfig

__all__ = ["build_query", "open_source", "open_stream", "run_audit_command"]

EXIT_OK, EXIT_TAMPERED, EXIT_USAGE = 0, 1, 2


def build_query(args: argparse.Namespace, now: datetime) -> Query:
    """The query the filter options describe."""
    return Query(
        event=getattr(args, "event", "decision"),
        tenants=frozenset(args.tenant),
        sandboxes=frozenset(args.sandbox),
        hosts=tuple(h.lower() for h in args.host),
        reasons=frozenset(args.reason),
        decisions=frozenset(args.decision),
        phases=frozenset(args.phase),
        credentials=frozenset(args.credential),
        approvals=frozenset(getattr(args, "approval", ())),
        tools=tuple(getattr(args, "tool", ())),
        rpc_methods=tuple(getattr(args, "rpc_method", ())),
        since=parse_time(args.since, now) if args.since else None,
        until=parse_time(args.until, now) if args.until else None,
    )


def open_source(args: argparse.Namespace) -> Source:
    """The trail the options name: `--redis`, `--config --stream`, `--file`, else the config's file."""
    if args.prefix is not None and not args.redis:
        raise AuditInputError("--prefix goes with --redis (with --config, redis.prefix is used)")
    if args.redis:
        return open_stream({"url": args.redis, "prefix": args.prefix or "sandgate:"})
    if args.stream:
        config = _load_config(args.config)
        if config.redis is None:
            raise AuditInputError(f"--stream: {args.config or 'the default config'} has no redis: section")
        return open_stream(config.redis.model_dump())
    path = args.file if args.file else _load_config(args.config).audit_path
    if not audit_files(path):
        raise AuditInputError(f"no audit file at {path}")
    return JsonlSource(path)


def _load_config(path: Path | None) -> GatewayConfig:
    """The gateway config, for a trail the options do not name."""
    # Lazy: the config model (pydantic, the policy schema) that --file and --redis do not need.
    from sandgate.proxy.config import load_config

    return load_config(path)


def open_stream(settings: dict[str, Any]) -> StreamSource:
    """The fleet audit stream of the redis `settings` describe (RedisConfig fields)."""
    # Lazy: the config model's validation error (pydantic), needed only for the fleet stream.
    from pydantic import ValidationError

    # Lazy: the stream reader, its redis client and config: nothing but the fleet stream uses them.
    from sandgate.proxy.audit.stream_source import BLOCK_MS, StreamSource
    from sandgate.proxy.config import RedisConfig
    from sandgate.proxy.redis.client import Keys, connect_sync

    # A reader can wait longer than a gateway; XREAD BLOCK holds the socket for BLOCK_MS too.
    timeout = min(max(float(settings.get("timeout_seconds", 0)), 5.0) + BLOCK_MS / 1000, 30.0)
    try:
        cfg = RedisConfig.model_validate({**settings, "timeout_seconds": timeout})
    except ValidationError as e:
        error = e.errors()[0]
        raise AuditInputError(f"redis {'.'.join(map(str, error['loc']))}: {error['msg']}") from None
    return StreamSource(connect_sync(cfg), Keys(cfg.prefix)("audit"), where=_server_name(cfg.url))


def _server_name(url: str) -> str:
    """Where a redis URL points, without credentials."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return parts.path
    return f"{parts.hostname}:{parts.port or 6379}"


def run_audit_command(args: argparse.Namespace) -> int:
    """Run one `sandgate audit` subcommand."""
    if args.audit_command == "verify":
        return _verify(args)
    query = build_query(args, datetime.now(UTC))
    if query.event == ANY_EVENT and getattr(args, "format", "json") == "table":
        print(
            "sandgate audit: --event any needs --format json or ocsf (a table has one kind's columns)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    source = open_source(args)
    command = {"tail": _tail, "query": _query, "stats": _stats, "suggest": _suggest}[args.audit_command]
    try:
        command(args, source, query)
    except KeyboardInterrupt:
        pass  # the way to end `tail --follow`
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, and keep Python's exit flush from failing.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    finally:
        if source.malformed:
            plural = "" if source.malformed == 1 else "s"
            print(f"sandgate audit: skipped {source.malformed} malformed line{plural}", file=sys.stderr)
        if source.gaps:
            print(
                f"sandgate audit: fell behind rotation ({source.gaps}x): records may be missing",
                file=sys.stderr,
            )
    return EXIT_OK


def _verify(args: argparse.Namespace) -> int:
    """`audit verify`: 0 intact, 1 tampered (the first break and the last good checkpoint), 2 bad input."""
    # Lazy: the chain checker and its cryptography, only for `verify`.
    from sandgate.proxy.audit.chain import load_public_key, public_key_path
    from sandgate.proxy.audit.verify import render_verdict, verify_trail

    files, partial = list(args.files), args.partial
    key_path = args.key
    if not files or key_path is None:
        config = _load_config(args.config)
        key_path = key_path or public_key_path(config.ca_dir)
        if not files:
            found = audit_files(config.audit_path)
            if not found:
                raise AuditInputError(f"no audit file at {config.audit_path}")
            files = list(reversed(found))
            partial = partial or len(found) - 1 >= config.audit.backups
    try:
        key = load_public_key(key_path)
    except (OSError, ValueError) as e:
        raise AuditInputError(f"audit verify: no public key: {e}") from None
    try:
        verdict = verify_trail(files, key, partial=partial, expect_seq=args.expect_seq)
    except OSError as e:
        raise AuditInputError(f"audit verify: {e.filename}: {e.strerror}") from None
    sys.stdout.write(render_verdict(verdict, args.format))
    return EXIT_OK if verdict.ok else EXIT_TAMPERED


def _print_records(records: Iterable[Record], fmt: str, event: str, *, flush: bool = False) -> None:
    """Records as JSON lines, their OCSF events as JSON lines, or table rows, on stdout."""
    for record in records:
        if fmt == "ocsf":
            for line in ocsf_lines(record):
                print(line, flush=flush)
        else:
            print(json_line(record) if fmt == "json" else table_row(record, event), flush=flush)


def _tail(args: argparse.Namespace, source: Source, query: Query) -> None:
    """`audit tail`: the last N records, then new ones with --follow."""
    # The handlers go in before the first line is printed: whoever saw output can stop it.
    with _interrupted_by_signals() if args.follow else contextlib.nullcontext():
        if args.format == "table":
            print(table_header(query.event), flush=args.follow)
        _print_records(source.latest(query, args.lines), args.format, query.event, flush=args.follow)
        if args.follow:
            with contextlib.closing(source.follow(query, threading.Event())) as new:
                _print_records(new, args.format, query.event, flush=True)


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt  # run_audit_command ends quietly with exit 0


@contextlib.contextmanager
def _interrupted_by_signals() -> Iterator[None]:
    """SIGINT and SIGTERM end the follower (KeyboardInterrupt: its files close, exit 0).

    Installed whatever the inherited disposition: a background job of a non-interactive shell
    starts with SIGINT ignored, and Python then never raises KeyboardInterrupt for it. The
    handler raises rather than setting an Event: Event.set takes a lock the interrupted code
    may hold."""
    watched = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, _interrupt) for sig in watched}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _query(args: argparse.Namespace, source: Source, query: Query) -> None:
    """`audit query`: matching records, oldest first, up to --limit."""
    if args.format == "table":
        print(table_header(query.event))
    with contextlib.closing(source.records(query)) as records:
        for i, record in enumerate(records, 1):
            _print_records([record], args.format, query.event)
            if args.limit is not None and i >= args.limit:
                break


def _stats(args: argparse.Namespace, source: Source, query: Query) -> None:
    """`audit stats`: counts per tenant, and approvals per sandbox; or per tool or method."""
    if args.by != "tenant":
        _call_stats(args, source, query)
        return
    approvals = ApprovalStats()
    with contextlib.closing(source.records(query)) as records:
        document = stats_document(collect_stats(_counted(records, approvals)), args.top)
    # Grants are records of their own event: a second pass, over those only (a malformed line
    # was counted by the first: counted once).
    malformed = source.malformed
    with contextlib.closing(source.records(replace(query, event=GRANT_EVENT))) as grants:
        for record in grants:
            approvals.add(record)
    source.malformed = malformed
    document["approvals"] = approvals_document(approvals)
    if args.format == "json":
        print(json.dumps(document, indent=2))
    else:
        print("\n".join(stats_table(document) + approvals_table(document["approvals"])))


def _call_stats(args: argparse.Namespace, source: Source, query: Query) -> None:
    """`audit stats --by tool|rpc-method`: agent-protocol calls per tool or per method."""
    with contextlib.closing(source.records(query)) as records:
        document = call_stats_document(collect_calls(records, args.by), args.top)
    if args.format == "json":
        print(json.dumps(document, indent=2))
    else:
        print("\n".join(call_stats_table(document)))


def _counted(records: Iterable[Record], approvals: ApprovalStats) -> Iterator[Record]:
    """`records`, each counted into `approvals` on the way."""
    for record in records:
        approvals.add(record)
        yield record


def _suggest(args: argparse.Namespace, source: Source, query: Query) -> None:
    """`audit suggest`: allow rules for one sandbox's denials, as YAML to review."""
    if len(args.sandbox) != 1:
        raise AuditInputError("suggest takes exactly one --sandbox")
    # Lazy: suggesting rules needs the policy schema, which reading records does not.
    from sandgate.proxy.audit.suggest import collect as collect_evidence
    from sandgate.proxy.audit.suggest import render_suggestions

    with contextlib.closing(source.records(query)) as records:
        evidence = collect_evidence(records, args.sandbox[0])
    sys.stdout.write(render_suggestions(evidence, args.min_count))
