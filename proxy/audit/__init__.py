"""The audit trail: records, the writer that never drops one, the redis stream, what a dead
process left (intents, spools) settled into it, and reading them back (sources, queries,
formats, stats, suggestions).
"""

# Its public modules, named but not imported (sandgate.proxy says why).
__all__ = [
    "approval_stats",
    "calls",
    "chain",
    "collector",
    "files",
    "format",
    "forward",
    "intents",
    "leftovers",
    "ocsf",
    "query",
    "records",
    "redis_stream",
    "refusals",
    "sinks",
    "spool",
    "stats",
    "stats_calls",
    "stream_source",
    "suggest",
    "suggest_operator",
    "suggest_protocols",
    "trail",
    "usage",
    "verify",
]
