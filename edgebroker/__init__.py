"""edgebroker: an MQTT broker for edge gateways."""

__version__ = "0.1.0"

# The pid of the process whose end stops `serve` as SIGTERM does, 0 for none: set by
# packaging/entry.py to the one-file binary's bootloader, the broker's parent (server/app.py).
stop_with_parent = 0


def __getattr__(name):
    # Lazy, so that importing edgebroker does not load the C helper.
    if name == "__native_backend__":
        from edgebroker import _native
        return _native.BACKEND
    raise AttributeError(f"module 'edgebroker' has no attribute {name!r}")
