"""SIEM sinks: the trail's records, as OCSF events or as they are, delivered at least once to
syslog, OTLP/HTTP, Splunk HEC or Elasticsearch bulk receivers.

Each sink is a disk queue (`queue`) that the audit writer appends to and never waits on the
network for, and a delivery thread (`delivery`) that sends batches through a transport
(`syslog`, `otlp`, `hec`, `elasticsearch`) and moves the queue's cursor once the receiver
acknowledged them.
"""

# Its public modules, named but not imported (sandgate.proxy says why).
__all__ = [
    "build",
    "courier",
    "delivery",
    "elasticsearch",
    "events",
    "fanout",
    "figures",
    "hec",
    "otlp",
    "queue",
    "sink",
    "syslog",
    "tlsconf",
    "transport",
]
