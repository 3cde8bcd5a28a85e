"""Secret sources behind one protocol, chosen by a reference's scheme: `env:`, `file:`,
`cmd:` and `stored:`.
"""

from sandgate.brokers.sources.command import CommandSource
from sandgate.brokers.sources.env import EnvSource
from sandgate.brokers.sources.file import FileSource
from sandgate.brokers.sources.registry import SecretRegistry, SecretSource, default_registry
from sandgate.brokers.sources.stored import StoredSource, StoredValues

__all__ = [
    "CommandSource",
    "EnvSource",
    "FileSource",
    "SecretRegistry",
    "SecretSource",
    "StoredSource",
    "StoredValues",
    "default_registry",
]
