"""The QoS 2 exchange journal on a full disk (a real one: a private tmpfs, tests/diskfull.py).
A write the full disk cut short is cut back to whole lines, so the first records written once
there is room again are read back at the next start (they were glued to the part line, and
skipped as damaged)."""

import os

from diskfull import fill_up, in_private_mount_namespace, mount_tmpfs
from edgebroker.core import exchanges


class Stats:
    exchange_write_errors = 0


def test_records_written_after_a_full_disk_are_read_back(tmp_path, request):
    if not in_private_mount_namespace(request):
        return
    small = tmp_path / "small"
    mount_tmpfs(small, "2m")
    journal = exchanges.ExchangeJournal(str(small), Stats())
    for i in range(60):             # most of a page: the next write needs a page it cannot get
        journal.received(f"pub-{i:02d}", i + 1, 1000 + i, 0xFFFFFFFF - i)
    journal.write()
    fill_up(small / "filler")
    for i in range(200):
        journal.received("pub-x", 200 + i, 5000 + i, i)
    journal.write()                 # cut short by the full disk
    assert journal.stats.exchange_write_errors == 1 and journal.failing
    name = exchanges.path(str(small), journal.generation)
    assert os.path.getsize(name) == journal.size        # no part line left
    os.unlink(small / "filler")
    journal.received("sensor-7", 42, 9001, 77)
    journal.sent("sensor-7", 43, 9002, 10, False)
    journal.write()
    journal.close()
    assert not journal.failing
    records = exchanges.load(str(small), journal.generation)
    assert records[-2:] == [["I", "sensor-7", 42, 9001, 77], ["O", "sensor-7", 43, 9002, 10, False]]
    assert len(records) == 62       # the 60 before, the two after; the failed pass's are lost
