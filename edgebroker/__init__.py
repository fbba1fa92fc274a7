"""edgebroker: an MQTT broker for edge gateways."""

__version__ = "0.1.0"
