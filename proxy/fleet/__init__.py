"""Fleet mode: one redis client setup, the registry sync, the reload channel and shared
rate-limit counts; nothing here is on the request path.
"""
