"""Fixtures of the client tests: ``remote``, a broker to run the client against, edgebroker
and a real Mosquitto in turn, which a test can stop and start again on the same port."""

from __future__ import annotations

import pytest


class Remote:
    """A broker the test can stop and start again on the same port, keeping its sessions."""

    def __init__(self, kind: str, broker, mosquitto_broker):
        self.kind = kind
        self._broker = broker
        if kind == "edgebroker":
            self.b = broker()
            self.port = self.b.port
            self._data_dir = self.b.config["data_dir"]
        else:
            # Mosquitto 2.0.11 leaves QoS 2 messages queued behind its in-flight limit (20)
            # unsent, for a subscriber that reads late (paho's too): no limits here.
            self.b = mosquitto_broker(extra=["max_inflight_messages 0",
                                             "max_queued_messages 0"])
            self.port = self.b.port
        self.host = "127.0.0.1"

    def stop(self) -> None:
        self.b.stop()

    def start(self) -> None:
        if self.kind == "edgebroker":
            self.b = self._broker(data_dir=self._data_dir,
                                  listener=[{"host": "127.0.0.1", "port": self.port}])
        else:
            self.b.start()


@pytest.fixture(params=["edgebroker", "mosquitto"])
def remote(request, broker, mosquitto_broker):
    return Remote(request.param, broker, mosquitto_broker)
