"""A reload's "take effect after a restart" warning: the listeners are compared as a set.
Swapping two [[listener]] tables alone (each listener keeps its own table) warned that the
listeners had changed."""

from edgebroker import config
from edgebroker.server.reload import needs_restart

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
