"""A reload (SIGHUP) keeps what it parsed of a password, ACL or TLS file that did not change
since it was read (device, inode, size, mtime, ctime), and reads a changed one again, also one
rewritten in place with its size and mtime put back (docs/config.md, "Reloading")."""

import os
import shutil
import signal
import ssl

from secfiles import write_acl, write_passwords
from server.conftest import client_context

ACL = "user alice\ntopic readwrite alice/#\n"


def reload(b):
    mark = b.mark()
    b.send_signal(signal.SIGHUP)
    line = b.wait_log("reload: re-read", start=mark)
    assert line, b.log_text()
    return line


def test_unchanged_files_are_not_read_again_and_changed_ones_are(broker, tmp_path, pki, uid):
    live = tmp_path / "live"
    live.mkdir()
    cert, key = shutil.copy(pki.server.cert, live / "server.crt"), \
        shutil.copy(pki.server.key, live / "server.key")
    pw = write_passwords(tmp_path / "passwd", {"alice": "first-pw1"})
    acl = write_acl(tmp_path / "acl", ACL)
    b = broker(password_file=str(pw), acl_file=str(acl),
               listener=[{"host": "127.0.0.1", "port": 0, "certfile": str(cert),
                          "keyfile": str(key)}])
    ctx = client_context(pki)
    tls = f"certificates of 127.0.0.1:{b.port}"
    line = reload(b)
    assert (f"reload: re-read no security files; unchanged since they were read, not read "
            f"again: {tls}, {pw}, {acl}") in line, line
    # Rewritten in place, the same size, mtime put back: ctime tells, so it is read again.
    st = os.stat(pw)
    write_passwords(pw, {"alice": "second-pw"})
    assert os.stat(pw).st_size == st.st_size and os.stat(pw).st_ino == st.st_ino
    os.utime(pw, ns=(st.st_atime_ns, st.st_mtime_ns))
    line = reload(b)
    assert f"reload: re-read {pw}; unchanged since they were read, not read again: {tls}, " \
           f"{acl}" in line, line
    b.client(f"{uid}-1", username="alice", password="first-pw1", transport={"ssl_context": ctx},
             expect_rc=4)
    assert b.client(f"{uid}-2", username="alice", password="second-pw",
                    transport={"ssl_context": ctx}).ping() == []
    # A renewed certificate is read again; the others are kept.
    renewed = pki.ca.issue("renewed", "localhost", server=True)
    shutil.copy(renewed.cert, cert)
    shutil.copy(renewed.key, key)
    line = reload(b)
    assert f"reload: re-read {tls}; unchanged since they were read, not read again: {pw}, " \
           f"{acl}" in line, line
    new = b.client(f"{uid}-3", username="alice", password="second-pw",
                   transport={"ssl_context": ctx})
    assert new.sock.getpeercert(binary_form=True) == \
        ssl.PEM_cert_to_DER_cert(open(renewed.cert).read())
    # A file made unsafe by chmod alone (content and mtime as they were) is not kept.
    os.chmod(pw, 0o644)
    mark = b.mark()
    b.send_signal(signal.SIGHUP)
    line = b.wait_log("reload failed", start=mark)
    assert line and "let other users read it" in line, line


def test_a_file_read_by_a_refused_reload_is_named_as_read_by_the_next(broker, tmp_path, uid):
    """A reload refused for its ACL file had read a changed password file too; the next
    reload, the first to put that file in force, named it "unchanged since they were read,
    not read again", as if the change had not been seen."""
    pw = write_passwords(tmp_path / "passwd", {"alice": "first-pw1"})
    acl = write_acl(tmp_path / "acl", ACL)
    b = broker(password_file=str(pw), acl_file=str(acl))
    write_passwords(pw, {"alice": "first-pw1", "bob": "bob-pw-12"})
    acl.write_text("user\n")
    mark = b.mark()
    b.send_signal(signal.SIGHUP)
    assert b.wait_log("reload failed", start=mark)
    write_acl(acl, ACL + "user bob\ntopic readwrite bob/#\n")
    line = reload(b)
    assert f"reload: re-read {pw}, {acl}" in line and "not read again" not in line, line
    assert b.client(f"{uid}-b", username="bob", password="bob-pw-12").ping() == []
