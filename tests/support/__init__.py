"""Real servers on loopback for end-to-end tests: a recording HTTP(S) upstream, nginx with
default settings, a scripted DNS server, a throwaway PKI, and port helpers. Each server
binds port 0 by default (nginx gets a free port), serves from a background thread (nginx
from a child process), and is used as a context manager or with start()/stop().
"""

from .dnsserver import DNSQuery, ScriptedDNSServer
from .nginx import NginxRequest, NginxServer
from .pki import TestPKI
from .ports import free_port, free_port_run, wait_for_port
from .redisserver import RedisServer, wait_for_presence_since
from .reflector import ReflectingUpstream, header_value
from .smalldisk import SmallDisk
from .upstream import RecordedConnection, RecordedRequest, RecordingUpstream

__all__ = [
    "DNSQuery",
    "NginxRequest",
    "NginxServer",
    "RecordedConnection",
    "RecordedRequest",
    "RecordingUpstream",
    "RedisServer",
    "ReflectingUpstream",
    "ScriptedDNSServer",
    "SmallDisk",
    "TestPKI",
    "free_port",
    "free_port_run",
    "header_value",
    "wait_for_port",
    "wait_for_presence_since",
]
