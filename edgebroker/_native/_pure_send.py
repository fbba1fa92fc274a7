"""The pure-Python twin's side of sending (csrc/edgebroker_native.c's namesakes): a batch of
buffers and file ranges written to a socket (``send_batch``), and the PUBLISH frames of a run
of log records (``publish_frames``). ``_pure`` exposes them with the rest of the twin.
"""

from __future__ import annotations

import errno
import os
import socket
from array import array

from edgebroker._native._common import (
    MAX_PAYLOAD, RECORD_HEADER_SIZE, SCAN_ENTRY_WORDS, SendResult,
)

HDR = RECORD_HEADER_SIZE


def send_batch(sock: socket.socket, items, start_item: int = 0, start_progress: int = 0,
               cork: bool = False) -> SendResult:
    sent = 0
    i, progress = start_item, start_progress
    err = 0
    n = len(items)
    if cork:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
        except OSError:
            pass
    fileno = sock.fileno()
    while i < n:
        head, fd, file_pos, file_len = items[i]
        head_len = len(head)
        if progress < head_len:
            flags = socket.MSG_NOSIGNAL | socket.MSG_DONTWAIT
            if file_len or i + 1 < n:
                flags |= socket.MSG_MORE
            try:
                r = sock.send(memoryview(head)[progress:], flags)
            except OSError as exc:
                err = errno.EAGAIN if exc.errno == errno.EWOULDBLOCK else exc.errno
                break
            sent += r
            progress += r
            continue
        if progress < head_len + file_len:
            done = progress - head_len
            try:
                r = os.sendfile(fileno, fd, file_pos + done, file_len - done)
            except OSError as exc:
                err = errno.EAGAIN if exc.errno == errno.EWOULDBLOCK else exc.errno
                break
            if r == 0:
                err = errno.ENODATA
                break
            sent += r
            progress += r
            continue
        i += 1
        progress = 0
    if cork:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)
        except OSError:
            pass
    return SendResult(sent, i, progress, err)



def publish_frames(buf, base_position: int, entries: array, first: int, n: int, qos, pids,
                   capacity: int) -> bytes:
    if first < 0 or n < 0 or (first + n) * SCAN_ENTRY_WORDS > len(entries) or \
            first + n > len(qos) or first + n > len(pids):
        raise ValueError(f"publish_frames: entries {first} to {first + n} are not all there")
    mv = memoryview(buf).cast("B")
    out = bytearray()
    for i in range(first, first + n):
        e = i * SCAN_ENTRY_WORDS
        position, length, meta = entries[e + 2], entries[e + 3], entries[e + 4]
        at = position - base_position
        cid_len, topic_len = meta >> 8 & 0xFFFF, meta >> 24 & 0xFFFF
        q = qos[i]
        if q == 255:
            continue
        if (q > 2 or position < base_position or at > len(mv) or length > len(mv) - at
                or length < HDR + cid_len + topic_len):
            raise ValueError("publish_frames: an entry outside the buffer, a QoS not 0 to 2 "
                             "or 255, or too small a capacity")
        payload_len = length - HDR - cid_len - topic_len
        remaining = 2 + topic_len + (2 if q else 0) + payload_len
        if remaining > MAX_PAYLOAD or capacity - len(out) < 5 + remaining:
            raise ValueError("publish_frames: an entry outside the buffer, a QoS not 0 to 2 "
                             "or 255, or too small a capacity")
        topic = at + HDR + cid_len
        out.append(0x30 | q << 1)
        while True:
            byte = remaining & 0x7F
            remaining >>= 7
            out.append(byte | 0x80 if remaining else byte)
            if not remaining:
                break
        out += topic_len.to_bytes(2, "big")
        out += mv[topic:topic + topic_len]
        if q:
            out += pids[i].to_bytes(2, "big")
        out += mv[topic + topic_len:topic + topic_len + payload_len]
    return bytes(out)
