"""The retained messages of a session snapshot: their entries in the document, and the side
file's names (format 3: their payloads are in ``retained-<N>.bin``, written and read by
core.retained_side, imported only when there are retained messages to write or a side file
to read: an idle broker with none does not hold its code, docs/deploy.md).
"""

from __future__ import annotations

import binascii   # formats 1 and 2: base64 payloads in the document
import json
import re

from edgebroker.errors import EdgebrokerError
from edgebroker.files import numbered_files
from edgebroker.records import field, record

MAGIC = b"EBRETAINED1\n"
PREFIX, SUFFIX = "retained-", ".bin"
FILE_NAME = re.compile(r"retained-([1-9][0-9]{0,18})\.bin\Z")


class SnapshotError(EdgebrokerError):
    """The snapshot file exists but cannot be used; the message says why and where.
    ``retained_file``: the side file's path when it is the one at fault."""

    def __init__(self, message: str, retained_file: str | None = None):
        super().__init__(message)
        self.retained_file = retained_file


@record
class RetainedState:
    topic: str
    payload: bytes
    qos: int
    offset: int | None
    # MQTT 5.0: its properties to forward (Message.properties) and the wall-clock time (ms)
    # its Message Expiry Interval ends, None for never.
    properties: bytes = b""
    expires_ms: int | None = None
    # Who published it (a bridge's own client id for what came from its remote; the topic
    # table's creator, max_topics_per_client); "" when not known (older snapshots).
    client_id: str = ""
    # Its JSON entry, once the writer encoded it (it holds ``place``, not the payload).
    encoded: bytes | None = field(default=None, compare=False, repr=False)
    # (position, payload length, properties length) in the side file of generation ``gen``
    # (0: none yet), by the write of sequence number ``seq``; set by the writer
    # (``RetainedFile.plan``) or read from a document.
    place: tuple[int, int, int] | None = field(default=None, compare=False, repr=False)
    gen: int = field(default=0, compare=False, repr=False)
    seq: int = field(default=0, compare=False, repr=False)


def name(generation: int) -> str:
    return f"{PREFIX}{generation}{SUFFIX}"


def generations(state_dir: str) -> list[int]:
    """The generations of the side files in ``state_dir``, ascending."""
    return numbered_files(state_dir, FILE_NAME)


def retained_json(r: RetainedState) -> bytes:
    """Its entry in the document (kept on it): its place in the side file, no payload."""
    if r.encoded is None:
        at, size, props = r.place
        r.encoded = json.dumps(
            {"topic": r.topic, "qos": r.qos, "offset": r.offset, "at": at, "size": size,
             **({"props_size": props} if props else {}),
             **({"expires_ms": r.expires_ms} if r.expires_ms is not None else {}),
             **({"client_id": r.client_id} if r.client_id else {})},
            separators=(",", ":")).encode("utf-8")
    return r.encoded


def retained_entry(r: dict) -> RetainedState:
    """A retained message of a document: its bytes in the document (formats 1 and 2, base64)
    or their place in the side file (format 3: read by ``load``). ValueError, KeyError,
    TypeError when a field is of the wrong type."""
    offset, expires = r.get("offset"), r.get("expires_ms")
    state = RetainedState(topic=str(r["topic"]), payload=b"", qos=int(r["qos"]),
                          offset=None if offset is None else int(offset),
                          expires_ms=None if expires is None else int(expires),
                          client_id=str(r.get("client_id", "")))
    if "payload" in r:
        state.payload = binascii.a2b_base64(r["payload"], strict_mode=True)
        state.properties = binascii.a2b_base64(r.get("properties", ""), strict_mode=True)
    else:
        state.place = (int(r["at"]), int(r["size"]), int(r.get("props_size", 0)))
    return state


def retained_file_head(value) -> list:
    """A document's ``retained_file``: [name, size, CRC-32]; ValueError when it is not one."""
    if (type(value) is not list or len(value) != 3 or type(value[0]) is not str
            or not FILE_NAME.match(value[0]) or type(value[1]) is not int or value[1] < len(MAGIC)
            or type(value[2]) is not int or not 0 <= value[2] <= 0xFFFFFFFF):
        raise ValueError(f"retained_file {value!r} is not [\"retained-<N>.bin\", size, crc32]")
    return value
