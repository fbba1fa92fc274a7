"""edgebroker.records: the record classes of the configuration, the commit log and the snapshot
behave as the standard library's dataclasses do for what the broker uses."""

from __future__ import annotations   # as in the package: annotations are strings

import pytest

from edgebroker.records import FrozenError, field, fields, record, replace


@record
class Session:
    client_id: str
    clean: bool = True
    subscriptions: dict = field(default_factory=dict)
    encoded: bytes | None = field(default=None, compare=False, repr=False)


@record(frozen=True)
class Settings:
    host: str = field(default="127.0.0.1", metadata={"doc": "address to bind"})
    port: int = 1883


@record(slots=True)
class Report:
    segments: int = 0
    damage: list = field(default_factory=list)

    def __post_init__(self):
        if self.segments < 0:
            raise ValueError("segments must be at least 0")


def test_init_by_position_or_name_with_defaults_and_factories():
    a, b = Session("dev-1"), Session(client_id="dev-2", clean=False, subscriptions={"t": 1})
    assert (a.client_id, a.clean, a.subscriptions, a.encoded) == ("dev-1", True, {}, None)
    assert (b.client_id, b.clean, b.subscriptions) == ("dev-2", False, {"t": 1})
    assert Session("x").subscriptions is not Session("y").subscriptions   # one dict each
    with pytest.raises(TypeError):
        Session()                                   # client_id has no default
    with pytest.raises(TypeError):
        Session("x", colour="red")                  # no such field


def test_eq_and_repr_leave_out_what_is_asked():
    a, b = Session("dev-1", encoded=b"1"), Session("dev-1", encoded=b"2")
    assert a == b and a != Session("dev-2") and a != ("dev-1",)
    assert repr(a) == "Session(client_id='dev-1', clean=True, subscriptions={})"
    with pytest.raises(TypeError):
        hash(a)                                     # mutable: not hashable, as dataclasses


def test_frozen_refuses_changes_and_hashes():
    s = Settings()
    with pytest.raises(FrozenError, match="port"):
        s.port = 1
    with pytest.raises(AttributeError):
        del s.host
    assert hash(s) == hash(Settings()) and {s: 1}[Settings("127.0.0.1", 1883)] == 1
    assert replace(s, port=8883) == Settings(port=8883) and s.port == 1883
    with pytest.raises(TypeError, match="colour"):
        replace(s, colour="red")


def test_fields_carry_name_type_default_and_metadata():
    host, port = fields(Settings)
    assert (host.name, host.type, host.default, host.metadata) == \
        ("host", "str", "127.0.0.1", {"doc": "address to bind"})
    assert (port.name, port.default, port.metadata) == ("port", 1883, {})
    assert fields(Settings()) == fields(Settings)
    assert Settings.port == 1883                    # plain defaults stay class attributes


def test_slots_and_post_init():
    r = Report(2)
    assert Report.__slots__ == ("segments", "damage") and not hasattr(r, "__dict__")
    r.damage.append("torn")
    assert r == Report(2, ["torn"])
    with pytest.raises(AttributeError):
        r.other = 1                                 # no instance dict
    with pytest.raises(ValueError, match="at least 0"):
        Report(-1)                                  # __post_init__ ran
    with pytest.raises(ValueError, match="at least 0"):
        replace(r, segments=-1)                     # replace goes through __init__


def test_a_field_without_default_after_one_with_is_refused():
    with pytest.raises(TypeError, match="'b' without a default"):
        @record
        class Wrong:
            a: int = 0
            b: int
