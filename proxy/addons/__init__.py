"""The mitmproxy addons, one concern each, in the order `runtime` adds them: identify the
sandbox, decide at every layer (gate), broker credentials, and the guards on connections,
heads, HTTP/2 streams, upgrades and trailers.
"""
