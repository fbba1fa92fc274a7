"""A link that fails while the bridge sends its last words: a protocol error or a ping
timeout makes the bridge send what its connection has to say, then close the link; a send
that fails closes the link itself (Bridge.on_closed lets go of it). Nothing is raised."""

from edgebroker.bridge import checkpoint
from edgebroker.client.events import PingTimeout

from .test_bridge_checkpoint import _bridge
from .test_outbound import _log


class FailingLink:
    """A link whose send fails: it closes, and tells the bridge so, as Link does."""

    def __init__(self, bridge):
        self.bridge = bridge
        self.closed = []
        self.bytes_out = 0

    def send(self, data: bytes) -> None:
        self.close("TLS error: broken pipe")

    def close(self, reason: str) -> None:
        if not self.closed:
            self.closed.append(reason)
            self.bridge.on_closed(reason)


def test_a_send_that_fails_while_the_link_is_given_up_raises_nothing(tmp_path):
    log = _log(tmp_path / "log", [(b"dev", b"a/x")] * 2)
    bridge = _bridge(tmp_path, log)
    checkpoint.write(bridge.path, "up", 0, 0)
    bridge.start()
    link = bridge.link = FailingLink(bridge)
    assert bridge._event(PingTimeout()) is True
    assert link.closed == ["TLS error: broken pipe"] and bridge.link is None
    log.close()
