"""The upload batch format (docs/upload-format.md): the golden batches in golden/ (made by
make_golden.py there) are what the writer produces byte for byte, the reader decodes them, and
every kind of damage or unknown version is refused with an error naming the file."""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

import pytest
import zstandard

from edgebroker import _native
from edgebroker.uploader.batch import (
    BatchFormatError, BatchHeader, check_gateway_id, object_name, read_batch_file,
    read_batch_raw,
    write_batch,
)

from edgebroker.mqtt.properties import decode_body

from .golden.make_golden import BATCHES, GATEWAY, properties, record, record_bytes, write

GOLDEN = Path(__file__).resolve().parent / "golden"


@pytest.mark.parametrize("name", sorted(BATCHES))
def test_writer_reproduces_the_golden_batch_byte_for_byte(tmp_path, name):
    write(name, tmp_path / name)
    assert (tmp_path / name).read_bytes() == (GOLDEN / name).read_bytes()


@pytest.mark.parametrize("name", sorted(BATCHES))
def test_a_batch_file_is_one_frame_of_the_size_the_writer_returns(tmp_path, name):
    """Nothing after the frame (an empty second frame once followed it in the batch file,
    though the put sent only the size returned)."""
    offsets, gap_first, gap_length, version = BATCHES[name]
    raw = b"".join(record_bytes(i, version) for i in offsets)
    header = BatchHeader(GATEWAY, offsets[0], offsets[-1], len(offsets), 0, 0, len(raw),
                         _native.crc32c(raw), gap_first, gap_length, version)
    path = tmp_path / name
    with open(path, "wb") as fh:
        fh.write(b"before")                      # the size counts from where the frame starts
        size = write_batch(fh, header, [raw[:3], raw[3:]])
    data = path.read_bytes()[len(b"before"):]
    assert size == len(data)
    d = zstandard.ZstdDecompressor().decompressobj()
    assert len(d.decompress(data)) == len(header.encode()) + len(raw)
    assert d.eof and d.unused_data == b""


@pytest.mark.parametrize("name", sorted(BATCHES))
def test_reader_decodes_the_golden_batch(name):
    offsets, gap_first, gap_length, version = BATCHES[name]
    header, records = read_batch_file(str(GOLDEN / name))
    assert (header.gateway_id, header.first_offset, header.last_offset, header.record_count) == \
        (GATEWAY, offsets[0], offsets[-1], len(offsets))
    assert (header.gap_first, header.gap_length) == (gap_first, gap_length)
    assert (header.version, header.log_format_version) == (1, version)
    got = [(r.offset, r.timestamp_ms, r.qos, r.retain, r.client_id, r.topic, r.payload,
            decode_body(r.properties)) for r in records]
    assert got == [(i, *record(i), properties(i, version)) for i in offsets]
    assert header.min_timestamp_ms == record(offsets[0])[0]
    assert header.max_timestamp_ms == record(offsets[-1])[0]


def test_standard_zstd_tool_decompresses_a_batch_to_header_and_records(tmp_path):
    """A batch is one plain zstd frame: `zstd -d` gives the header then the record bytes."""
    out = tmp_path / "b.ebb"
    subprocess.run(["zstd", "-q", "-d", str(GOLDEN / "v1-plain.ebb.zst"), "-o", str(out)],
                   check=True)
    data = out.read_bytes()
    assert data[:8] == b"EDGEBBAT"
    hlen = struct.unpack_from("<H", data, 10)[0]
    assert hlen == 88 + len(GATEWAY) and data[88:hlen] == GATEWAY.encode()
    raw_len, = struct.unpack_from("<Q", data, 56)
    assert len(data) == hlen + raw_len
    assert _native.crc32c(data[hlen:]) == struct.unpack_from("<I", data, 80)[0]


def _rewrite(tmp_path: Path, change) -> str:
    """The plain golden batch, decompressed, changed by ``change(bytearray)``, recompressed."""
    data = bytearray(zstandard.ZstdDecompressor().decompress(
        (GOLDEN / "v1-plain.ebb.zst").read_bytes()))
    change(data)
    path = tmp_path / "changed.ebb.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(bytes(data)))
    return str(path)


def _fix_header_crc(data: bytearray) -> None:
    hlen = struct.unpack_from("<H", data, 10)[0]
    struct.pack_into("<I", data, 84, _native.crc32c(bytes(data[88:hlen]),
                                                    _native.crc32c(bytes(data[:84]))))


def _set(fmt: str, at: int, value, fix_crc: bool = True):
    def change(data: bytearray) -> None:
        struct.pack_into(fmt, data, at, value)
        if fix_crc:
            _fix_header_crc(data)
    return change


@pytest.mark.parametrize("change, message", [
    (_set("<H", 8, 2), "batch format version 2; this edgebroker reads version 1"),
    (_set("<H", 12, 7), "log format version 7"),
    (_set("<8s", 0, b"NOTABAT!"), "not an edgebroker upload batch"),
    (_set("<Q", 16, 1, fix_crc=False), "header checksum mismatch"),
    (_set("<I", 80, 12345), "the records' checksum does not match"),
    (_set("<Q", 32, 11), "11"),
    (lambda d: d.__setitem__(slice(len(d) - 1, None), b"?"), "checksum"),
    (lambda d: d.extend(b"junk"), "bytes after"),
    (lambda d: d.__delitem__(slice(len(d) - 5, None)), "ends inside the records"),
    # Impossible headers, refused before anything is allocated by their numbers.
    (_set("<Q", 32, 0), "no records (a batch holds at least one)"),
    (_set("<Q", 32, 1 << 40), "1099511627776 records cannot lie in 770 raw bytes"),
    (_set("<Q", 56, (1 << 30) + 1), "raw length 1073741825, more than a batch holds"),
    (_set("<9s", 88, b"../../xyz"), "gateway id '../../xyz' must be 1 to 64 of"),
    (_set("<Q", 24, 1 << 63), "offsets 0..9223372036854775808 with a gap of 0 from 0 are not"),
    (_set("<Q", 72, 1), "offsets 0..9 with a gap of 1 from 0 are not possible"),
])
def test_damage_and_unknown_versions_are_refused_naming_the_file(tmp_path, change, message):
    path = _rewrite(tmp_path, change)
    with pytest.raises(BatchFormatError) as err:
        read_batch_file(path)
    assert str(err.value).startswith(path + ":") and message in str(err.value)


def test_not_zstd_or_missing_file(tmp_path):
    bad = tmp_path / "x.ebb.zst"
    bad.write_bytes(b"hello, not zstd at all")
    with pytest.raises(BatchFormatError, match=f"{bad}: not a valid zstd stream"):
        read_batch_file(str(bad))
    truncated = tmp_path / "t.ebb.zst"
    truncated.write_bytes((GOLDEN / "v1-plain.ebb.zst").read_bytes()[:-20])
    with pytest.raises(BatchFormatError, match=str(truncated)):
        read_batch_file(str(truncated))
    with pytest.raises(BatchFormatError, match="cannot read"):
        read_batch_file(str(tmp_path / "missing.ebb.zst"))


def test_object_name_is_deterministic_and_dated_by_the_first_record_in_utc():
    # 1700000000000 ms is 2023-11-14T22:13:20Z
    assert object_name("", "gw-1", 5, 42, 1_700_000_000_000) == \
        "gateway=gw-1/date=2023-11-14/00000000000000000005-00000000000000000042.ebb.zst"
    assert object_name("/land/", "gw-1", 0, 0, 1_700_006_400_000).startswith(
        "land/gateway=gw-1/date=2023-11-15/")


@pytest.mark.parametrize("gid, ok", [("gw-1", True), ("a" * 64, True), ("0123abcdef.x_y", True),
                                     ("", False), ("a" * 65, False), ("gw/1", False),
                                     ("gw 1", False), (".hidden", False), ("-x", False),
                                     ("gé", False), ("__HIVE_DEFAULT_PARTITION__", False),
                                     ("__hive_default_partition__", True)])
def test_gateway_id_check(gid, ok):
    assert (check_gateway_id(gid) is None) == ok


def test_a_gateway_id_spark_reads_back_as_null_is_a_config_error():
    """gateway=__HIVE_DEFAULT_PARTITION__ is the folder Spark writes a null partition value
    to: the ingest job's tables would hold such a gateway's rows with no gateway."""
    from edgebroker import config
    from edgebroker.errors import ConfigError
    with pytest.raises(ConfigError, match=r"^upload\.gateway_id: is the name Spark and Hive "
                                          r"give a null partition value"):
        config.from_dict({"upload": {"url": "file:///srv/landing",
                                     "gateway_id": "__HIVE_DEFAULT_PARTITION__"}})


def test_header_round_trip():
    h = BatchHeader("g", 1, 2, 2, 10, 20, 100, 0xDEADBEEF, 0, 0)
    from edgebroker.uploader.batch import decode_header
    assert decode_header(h.encode(), "x") == h


def test_records_with_properties_need_log_format_version_2(tmp_path):
    """The golden version 2 batch relabelled as version 1: its records with properties are
    malformed there (attributes bit 3 is reserved in version 1)."""
    data = bytearray(zstandard.ZstdDecompressor().decompress(
        (GOLDEN / "v2-props.ebb.zst").read_bytes()))
    _set("<H", 12, 1)(data)
    path = tmp_path / "relabelled.ebb.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(bytes(data)))
    with pytest.raises(BatchFormatError, match=r"relabelled\.ebb\.zst: record at raw position "
                                               r"\d+ \(offset 31\): malformed header"):
        read_batch_file(str(path))


@pytest.mark.parametrize("extra", [struct.pack("<II", 0x184D2A50, 4) + b"XXXX",
                                   struct.pack("<II", 0x184D2A5F, 0), b"\0\0\0", b"garbage!"],
                         ids=["skippable-frame", "empty-skippable-frame", "zeros", "garbage"])
def test_bytes_after_the_frame_are_refused_by_both_readers(tmp_path, extra):
    """A skippable zstd frame after the batch passed read_batch_file (it read across frames)
    while read_batch_raw, Spark's reader, refused it: both refuse anything after the frame."""
    blob = (GOLDEN / "v1-plain.ebb.zst").read_bytes() + extra
    path = tmp_path / "x.ebb.zst"
    path.write_bytes(blob)
    for read in (lambda: read_batch_file(str(path)), lambda: read_batch_raw(blob, str(path))):
        with pytest.raises(BatchFormatError) as err:
            read()
        assert str(err.value) == f"{path}: not a valid zstd stream: {len(extra)} bytes after " \
                                 f"its frame"
