"""``[upload]`` made real: the gateway id (``gateway_id_of``), the sink its ``url`` names
(``open_sink``: a ``DirSink`` for ``file://``, an ``S3Sink`` for ``s3://``, uploader/sinks.py,
uploader/s3.py), and the check serve and ``config check`` make of both before anything is
opened (``check_config``)."""

from __future__ import annotations

import socket

from edgebroker.errors import ConfigError
from edgebroker.upload_config import check_gateway_id, check_upload_url, url_path
from edgebroker.uploader.sinks import DirSink

MACHINE_ID = "/etc/machine-id"


def default_gateway_id(machine_id_path: str = MACHINE_ID) -> str:
    """The machine id (systemd's /etc/machine-id), else the host name."""
    try:
        with open(machine_id_path, encoding="ascii") as fh:
            text = fh.read().strip()
        if text and check_gateway_id(text) is None:
            return text
    except (OSError, UnicodeDecodeError):
        pass
    return socket.gethostname().split(".")[0]


def gateway_id_of(upload_config) -> str:
    gid = upload_config.gateway_id or default_gateway_id()
    problem = check_gateway_id(gid)
    if problem:
        how = ("" if upload_config.gateway_id
               else " (taken from the machine id or host name: set it)")
        raise ConfigError(f"upload.gateway_id: {gid!r} {problem}{how}")
    return gid


def open_sink(config):
    """The sink of ``[upload]`` (``config``: an UploadConfig): ``file://`` or ``s3://``."""
    url = config.url
    problem = check_upload_url(url) if url else "empty: no uploading"
    if problem:
        raise ConfigError(f"upload.url: {problem}, got {url!r}")
    if url.startswith("s3://"):
        # Imported here: http.client brings ssl and hashlib (OpenSSL, 3 MiB of RSS) into a
        # broker that would otherwise not load them (tests/server/test_lazy_imports.py).
        from edgebroker.uploader.s3 import S3Sink
        return S3Sink(url, config)
    return DirSink(url_path(url))


def check_config(config) -> None:
    """The ConfigError the uploader would stop the start with (``config``: an UploadConfig):
    its gateway id, its URL, and for s3 the credentials and CA file, every problem at once.
    Called by serve before it opens any state, and by ``config check``."""
    problems = []
    try:
        gateway_id_of(config)
    except ConfigError as exc:
        problems += exc.problems
    if config.url.startswith("s3://"):
        from edgebroker.uploader.s3 import config_problems  # (imported as open_sink does)
        problems += config_problems(config)
    else:
        try:
            open_sink(config).close()
        except ConfigError as exc:
            problems += exc.problems
    if problems:
        raise ConfigError(*problems)
