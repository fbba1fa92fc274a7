"""A queued PUBLISH whose payload is a range of a commit-log segment file (server/transport.py's
``write_file``): sent with the native helper's sendfile batch, or read into memory by a TLS
transport; looked up again if retention deleted segments before it went out."""

from __future__ import annotations


class FileChunk:
    """A queued PUBLISH whose payload is a range of a log segment file."""

    __slots__ = ("head", "fd", "position", "length", "offset", "generation")

    def __init__(self, head: bytes, fd: int, position: int, length: int, offset: int,
                 generation: int):
        self.head = head
        self.fd = fd
        self.position = position
        self.length = length
        self.offset = offset
        self.generation = generation

    def __len__(self) -> int:
        return len(self.head) + self.length
