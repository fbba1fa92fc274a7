"""`config check` makes the checks serve makes of the bridges' TLS files and of the uploader's
credentials and CA file (it said OK, then serve stopped), and serve makes them before it opens
any state (an s3 credentials problem stopped it after the commit log was opened)."""

import pytest

from conftest import run_cli

ERROR = "edgebroker: config error: "
BRIDGE = '[[bridge]]\nname = "up"\naddress = "127.0.0.1:1"\ntopic = [{pattern = "a/#"}]\n'
S3 = '[upload]\nurl = "s3://bucket-x/p"\nendpoint_url = "https://127.0.0.1:1"\n'


@pytest.fixture(autouse=True)
def no_aws_variables(monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                 "AWS_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)


def cases(tmp_path):
    missing = tmp_path / "missing" / "ca.pem"
    return [
        (BRIDGE + f'cafile = "{missing}"\n',
         [f"bridge[0] (up): cannot use its TLS files (cafile '{missing}', certfile '', "
          f"keyfile ''): No such file or directory"]),
        (S3 + 'access_key_id = "AKIA"\n',
         ["upload.secret_access_key: empty while upload.access_key_id is set: access_key_id "
          "and secret_access_key go together"]),
        (S3 + 'secret_access_key = "s"\n',
         ["upload.access_key_id: empty while upload.secret_access_key is set: access_key_id "
          "and secret_access_key go together"]),
        (S3, ["upload.url is s3:// but no credentials were given: set upload.access_key_id and "
              "upload.secret_access_key, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the "
              "environment"]),
        (S3 + f'access_key_id = "a"\nsecret_access_key = "b"\nca_file = "{missing}"\n',
         [f"upload.ca_file: cannot read the CA certificates {missing}: No such file or "
          f"directory"]),
    ]


@pytest.mark.parametrize("command", [("config", "check"), ("serve",)])
@pytest.mark.parametrize("case", range(5))
def test_link_problems_are_found_by_config_check_and_before_serve_opens_its_state(
        tmp_path, command, case):
    text, problems = cases(tmp_path)[case]
    path = tmp_path / "c.toml"
    data = tmp_path / "data"
    path.write_text(f'data_dir = "{data}"\n[[listener]]\nport = 0\n' + text)
    r = run_cli(*command, "-c", str(path))
    want = "".join(f"{ERROR}{path}: {p}\n" for p in problems)   # both name the file
    assert (r.returncode, r.stderr) == (2, want)
    assert not (data / "log").exists()


def test_config_check_names_every_link_problem_at_once(tmp_path):
    """The bridges' and the uploader's problems together, and each of the uploader's."""
    missing = tmp_path / "ca.pem"
    path = tmp_path / "c.toml"
    path.write_text(f'data_dir = "{tmp_path / "data"}"\n[[listener]]\nport = 0\n'
                    f'{BRIDGE}cafile = "{missing}"\n{S3}ca_file = "{missing}"\n')
    r = run_cli("config", "check", "-c", str(path))
    assert r.returncode == 2
    lines = r.stderr.splitlines()
    assert len(lines) == 3, r.stderr
    for line, start in zip(lines, ["bridge[0] (up): ", "upload.url is s3:// but no credentials",
                                   "upload.ca_file: "]):
        assert line.startswith(f"{ERROR}{path}: {start}"), line


PORT = "the port must be a number from 1 to 65535"


@pytest.mark.parametrize("command", [("config", "check"), ("serve",)])
@pytest.mark.parametrize("endpoint, problem", [
    ("http://127.0.0.1:99999", PORT), ("http://minio:90o0", PORT), ("http://minio:0", PORT),
    ("http://:9000", "no host"), ("https://[::1:9000", "Invalid IPv6 URL"),
    ("http://user@minio:9000", "no user name, '?' or '#'"),
    ("http://minio:9000/?x=1", "no user name, '?' or '#'"),
])
def test_an_endpoint_url_that_would_fail_at_use_is_a_config_error(tmp_path, command, endpoint,
                                                                    problem):
    """It was checked for its scheme only: config check said OK, then serve stopped with a
    ValueError traceback at the sink's start (an impossible port)."""
    path = tmp_path / "c.toml"
    data = tmp_path / "data"
    path.write_text(f'data_dir = "{data}"\n[[listener]]\nport = 0\n[upload]\n'
                    f'url = "s3://bucket-x/p"\nendpoint_url = "{endpoint}"\n'
                    f'access_key_id = "a"\nsecret_access_key = "b"\n')
    r = run_cli(*command, "-c", str(path))
    want = (f"{ERROR}{path}: upload.endpoint_url: expected http://host:port or "
            f"https://host:port")
    assert r.returncode == 2 and r.stderr.startswith(want), r.stderr
    assert problem in r.stderr and repr(endpoint) in r.stderr and "Traceback" not in r.stderr
    assert not (data / "log").exists()


@pytest.mark.parametrize("url, problem", [
    ("s3://landing/a#frag", "'?' and '#' may not appear"),
    ("s3://landing/q?x=1", "'?' and '#' may not appear"),
    ("file:///srv/land#1", "'?' and '#' may not appear"),
    ("file:///srv/land%zz", "'%' at '%zz' is not %XX"),
    ("s3://landing/a%ff", "its %XX escapes are not UTF-8"),
    ("file:///srv/a%00b", "its path holds a control character"),
])
def test_an_upload_url_whose_path_would_be_cut_or_misread_is_a_config_error(tmp_path, url,
                                                                            problem):
    """'#' and '?' passed, and both sinks cut the path there (s3://landing/a#frag stored under
    a/, file:///srv/land#1 wrote to /srv/land)."""
    path = tmp_path / "c.toml"
    path.write_text(f'data_dir = "{tmp_path / "data"}"\n[[listener]]\nport = 0\n[upload]\n'
                    f'url = "{url}"\ngateway_id = "gw1"\naccess_key_id = "a"\n'
                    f'secret_access_key = "b"\n')
    r = run_cli("config", "check", "-c", str(path))
    assert r.returncode == 2 and r.stderr.startswith(f"{ERROR}{path}: upload.url: {problem}"), \
        r.stderr
    assert r.stderr.rstrip().endswith(f"got {url!r}")
