"""A reload's "take effect after a restart" warning: the listeners are compared as a set.
Swapping two [[listener]] tables alone (each listener keeps its own table) warned that the
listeners had changed."""

from edgebroker import config
from edgebroker.server.reload import match_listeners, needs_restart

A = '[[listener]]\nhost = "127.0.0.1"\nport = 1883\n'
B = '[[listener]]\nhost = "127.0.0.1"\nport = 1884\npassword_file = "{pw}"\n'
C = '[[listener]]\nhost = "127.0.0.1"\nport = 1885\n'


def load(tmp_path, name: str, text: str) -> config.Config:
    (tmp_path / "pw").write_text("")
    (tmp_path / "pw").chmod(0o600)
    path = tmp_path / name
    path.write_text(f'data_dir = "{tmp_path}"\n' + text.replace("{pw}", str(tmp_path / "pw")))
    return config.load(str(path))


def test_listener_tables_in_another_order_need_no_restart(tmp_path):
    started = load(tmp_path, "a.toml", A + B)
    assert needs_restart(started, load(tmp_path, "b.toml", B + A)) == []
    assert needs_restart(started, load(tmp_path, "c.toml", A + C)) == [
        "listeners (addresses, protocol, websocket_path, TLS on or off)"]
    assert needs_restart(started, load(tmp_path, "d.toml", A + B + C)) == [
        "listeners (addresses, protocol, websocket_path, TLS on or off)"]


def test_a_listener_whose_tls_is_turned_off_does_not_take_anothers_table(tmp_path, pki):
    """Two listeners on 127.0.0.1:0, the second with TLS; one reload refuses anonymous
    clients on the first and turns the second's TLS off. The first was matched to the second
    table (equal to its own old one) and went on letting anonymous clients in: each keeps
    the table at its position when its address, protocol and TLS are those it runs with."""
    plain = '[[listener]]\nhost = "127.0.0.1"\nport = 0\nallow_anonymous = true\n'
    tls = (plain + f'certfile = "{pki.server.cert}"\nkeyfile = "{pki.server.key}"\n')
    locked = plain.replace("allow_anonymous = true", "allow_anonymous = false")
    started = load(tmp_path, "a.toml", plain + tls)
    assert match_listeners(list(started.listeners),
                           load(tmp_path, "b.toml", locked + plain).listeners) == [0, None]
    assert match_listeners(list(started.listeners),
                           load(tmp_path, "c.toml", plain + tls).listeners) == [0, 1]
    assert match_listeners(list(started.listeners),
                           load(tmp_path, "d.toml", tls + plain).listeners) == [1, 0]
