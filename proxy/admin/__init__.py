"""The admin API: a unix socket (and optional TCP with a bearer token), its routes, and the
CLI's client.
"""
