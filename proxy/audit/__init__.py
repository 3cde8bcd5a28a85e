"""The audit trail: records, the writer that never drops one, the redis stream, and reading
them back (sources, queries, formats, stats, suggestions).
"""
