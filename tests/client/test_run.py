"""``EventLoop.run``: a batch request the connection can never send (5.0 properties over
3.1.1) is answered as refused within the batch: its Acked 0x80 is in ``result.done``, not
``result.events``, and the loop's own source is not told of it (docs/client.md, "run")."""

from __future__ import annotations

from edgebroker.client.events import Acked
from edgebroker.client.loop import EventLoop
from edgebroker.client.requests import make_publish


class Source:
    """A source with nothing to give that records what it is told was answered."""

    def __init__(self):
        self.told = []

    def __iter__(self):
        while True:
            yield None

    def acked(self, request):
        self.told.append(request)


def test_a_batch_request_refused_before_sending_is_in_done(broker, uid):
    b = broker()
    source = Source()
    loop = EventLoop(b.host, b.port, client_id=f"{uid}r", protocol=4, requests=source)
    try:
        ok = make_publish(f"{uid}/run", b"1", qos=1)
        bad = make_publish(f"{uid}/run", b"2", qos=1, properties={0x02: 60})
        after = make_publish(f"{uid}/run", b"3", qos=0)
        result = loop.run([ok, bad, after], timeout=10)
        assert result.complete
        answers = {id(e.request): e.reason_code for e in result.done}
        assert answers == {id(ok): 0, id(bad): 0x80, id(after): 0}
        assert not [e for e in result.events if type(e) is Acked]
        assert source.told == []
    finally:
        loop.shutdown()
