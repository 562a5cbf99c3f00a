"""kvcheck's Python adapter SDK: what a Python engine needs to be checked by
kvcheck through a process boundary.

The semantic core, importable on its own with only torch (and the numpy it
ships with):
  content  the cache content model, values, hashes, views and digests,
           bit-exact with kvcheck's C++ side;
  cache    transformers-compatible caches of both layouts and the
           cache-level operations (clone, concat, to_legacy, from_legacy);
  observe  storage identities, length and view of any cache object;
  copies   K/V copy accounting through a torch dispatch mode;
  decoder  the small deterministic attention decoder kvcheck's C++ side runs.

Modules are imported by name (`from kvcheck_adapter import content`); this
file imports none of them, so that importing one costs only what it needs.
"""

# The SDK's version is kvcheck's (the top CMakeLists.txt's project version;
# a test keeps them equal), and it speaks the adapter protocol of the
# kvcheck of that version: protocol.PROTOCOL_VERSION. kvcheck_adapter.locate
# finds the kvcheck binary and tells a mismatch in one message.
__version__ = "0.1.0"


def __getattr__(name):
    """kvcheck_adapter.Lock and kvcheck_adapter.yield_point (the yield
    points of a thread-safe adapter: kvcheck_adapter.threads), imported
    when first asked for."""
    if name in ("Lock", "yield_point"):
        from . import threads

        return getattr(threads, name)
    raise AttributeError(f"module 'kvcheck_adapter' has no attribute {name!r}")
