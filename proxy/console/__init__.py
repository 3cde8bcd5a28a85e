"""The operator's console: web pages under /console/ on the admin TCP listener (off by default).

`app` builds its routes; `sessions` is the login (the admin token exchanged for a session
cookie), its CSRF token and the login rate limit; `base` the security headers and checks every
page shares; `pages` the inbox, grants and overview pages and their forms; `feed` and `stream`
the live decisions (one tail of the trail, fanned out to a bounded set of server-sent event
streams); `overview` and `charts` the aggregation of the trail and its SVG charts; `trail`
which trail they read (the fleet's audit stream with `redis:`, else the file); `explain` a
record's `policy explain`; `suggest` a sandbox's suggested rules; `actions` what the console
acts through (the admin API's own functions, handed in by the admin server).
"""

# Its public modules, named but not imported (sandgate.proxy says why).
__all__ = [
    "actions",
    "app",
    "base",
    "charts",
    "explain",
    "feed",
    "overview",
    "pages",
    "sessions",
    "stream",
    "suggest",
    "trail",
]
