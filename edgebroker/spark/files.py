"""The ingest job's file system side, in the driver (docs/spark.md): the few Hadoop FileSystem
calls it makes (``_Fs``), the landing area's listing, the forms Spark names a path in, and the
lock that lets one pass at a time work on a local checkpoint folder (``pass_lock``)."""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager

from edgebroker.uploader.batch import SUFFIX

LOCK_NAME = "ingest.lock"


class PassRunning(RuntimeError):
    """Another ingest pass holds the checkpoint folder's lock."""


class _Fs:
    """The few Hadoop FileSystem calls the driver makes (exists, status, rename, qualify)."""

    def __init__(self, spark):
        self.jvm = spark._jvm
        self.conf = spark._jsc.hadoopConfiguration()

    def _path(self, p: str):
        return self.jvm.org.apache.hadoop.fs.Path(p)

    def qualify(self, p: str) -> str:
        path = self._path(p)
        return str(path.getFileSystem(self.conf).makeQualified(path).toString()).rstrip("/")

    def exists(self, p: str) -> bool:
        path = self._path(p)
        return bool(path.getFileSystem(self.conf).exists(path))

    def status(self, uri: str) -> tuple[str, int, int]:
        """(path as Spark's scans name it, length, modification time in ms) of the file at
        ``uri``."""
        path = self.jvm.org.apache.hadoop.fs.Path(self.jvm.java.net.URI(uri))
        st = path.getFileSystem(self.conf).getFileStatus(path)
        return str(st.getPath().toString()), int(st.getLen()), int(st.getModificationTime())

    def stamp(self, p: str) -> tuple[int, int] | None:
        """(length, modification time in ms) of the file at ``p``; None when there is none."""
        from py4j.protocol import Py4JJavaError
        path = self._path(p)
        try:
            st = path.getFileSystem(self.conf).getFileStatus(path)
        except Py4JJavaError as exc:
            if "FileNotFoundException" in str(exc.java_exception.getClass().getName()):
                return None
            raise
        return int(st.getLen()), int(st.getModificationTime())

    def open_error(self, p: str) -> str | None:
        """Why the file at ``p`` cannot be opened and read to its end (the file system's words:
        "... (Permission denied)", "FSError: java.io.IOException: Input/output error"), or None
        when it can. Read whole, in the JVM: a read error past the first bytes counts."""
        from py4j.protocol import Py4JJavaError
        path = self._path(p)
        try:
            stream = path.getFileSystem(self.conf).open(path)
            try:
                stream.transferTo(self.jvm.java.io.OutputStream.nullOutputStream())
            finally:
                stream.close()
        except Py4JJavaError as exc:
            return _java_error(exc)
        return None

    def write_error(self, folder: str) -> str | None:
        """Why a file cannot be made and deleted in ``folder`` (what a move out of it needs),
        tried with a hidden file (Spark's scans skip names starting with ``.``); None when it
        can."""
        from py4j.protocol import Py4JJavaError
        probe = self._path(f"{folder}/.edgebroker-probe-{os.getpid()}")
        fs = probe.getFileSystem(self.conf)
        try:
            fs.create(probe, True).close()
            if not fs.delete(probe, False):
                return f"cannot delete {probe.toString()}"
        except Py4JJavaError as exc:
            return _java_error(exc)
        return None

    def free_name(self, dst: str) -> str:
        """``dst``, or ``dst.1``, ``dst.2``... when that name is taken (the same bad batch
        uploaded again)."""
        fs = self._path(dst).getFileSystem(self.conf)
        name, n = dst, 0
        while fs.exists(self._path(name)):
            n += 1
            name = f"{dst}.{n}"
        return name

    def move(self, src: str, dst: str) -> None:
        """Move ``src`` to ``dst`` (a free name), or raise OSError naming the cause. Hadoop's
        local file system falls back to a copy and a delete when the rename fails: a copy
        left at ``dst`` while ``src`` is still there is deleted."""
        from py4j.protocol import Py4JJavaError
        s, d = self._path(src), self._path(dst)
        fs = s.getFileSystem(self.conf)
        try:
            fs.mkdirs(d.getParent())
            if fs.rename(s, d):
                return
            cause = (self.write_error(str(s.getParent().toString()))
                     or self.write_error(str(d.getParent().toString()))
                     or "the file system refused the rename")
        except Py4JJavaError as exc:
            cause = _java_error(exc)
        if fs.exists(s) and fs.exists(d):
            fs.delete(d, False)
        raise OSError(f"cannot move {src} to {dst}: {cause}")


def _java_error(exc) -> str:
    """A Java exception's (Py4JJavaError's, or a Java object's) class (without its package)
    and first line."""
    from py4j.protocol import Py4JJavaError
    java = exc.java_exception if isinstance(exc, Py4JJavaError) else exc
    text = (str(java.getMessage() or "").strip().splitlines() or [""])[0]
    return f"{str(java.getClass().getSimpleName())}: {text[:300]}"


def read_failure(exc) -> str | None:
    """When a Spark job (its Py4JJavaError) failed because a file could not be read (Spark's
    "Encountered error while reading file ..."): what the read raised, as class and first
    line ("FSError: java.io.IOException: Input/output error": Hadoop's local file system wraps
    a read's IOException in FSError, a java.lang.Error, which ignoreCorruptFiles does not
    skip); None for any other failure."""
    java, outer = exc.java_exception, None
    while java is not None:
        if "Encountered error while reading file" in str(java.getMessage() or ""):
            outer = java
        java = java.getCause()
    if outer is None:
        return None
    return _java_error(outer.getCause() or outer)


def local_path(uri: str) -> str | None:
    """The operating system's path of a qualified ``file:`` path; None for another scheme."""
    if not uri.startswith("file:"):
        return None
    rest = uri[len("file:"):]
    return "/" + rest[2:].partition("/")[2] if rest.startswith("//") else rest


def check_landing(landing: str) -> None:
    """Raise FileNotFoundError naming ``landing`` (a qualified path) when it is on the local
    file system and is not there (a mistyped ``--landing``), before the pass makes its
    checkpoint folder. Another file system's landing area (s3a, hdfs) is not looked at here:
    the listing fails on it (PATH_NOT_FOUND) as it would."""
    folder = local_path(landing)
    if folder is None:
        return
    try:
        os.stat(folder)
    except FileNotFoundError:
        raise FileNotFoundError(f"the landing area {landing} does not exist: nothing "
                                f"done") from None


@contextmanager
def pass_lock(checkpoint: str):
    """Hold ``<checkpoint>/ingest.lock`` (flock, exclusive) for a pass over a local checkpoint
    folder, the holder's pid written in it; raise PassRunning at once when another pass (of
    this process or another) holds it. On another file system (s3a, hdfs) nothing is locked:
    one pass at a time is the operator's to ensure (docs/spark.md)."""
    folder = local_path(checkpoint)
    if folder is None:
        yield None
        return
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, LOCK_NAME)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise PassRunning(f"another ingest pass holds {path} (pid {holder}); this one does "
                              f"nothing: one pass at a time per checkpoint folder") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield path
    finally:
        os.close(fd)   # releases the lock


def list_landing(spark, fs, landing: str) -> tuple[list, list]:
    """The batch files under ``landing``: ((path, length, modification time in ms) of those
    with bytes, (path, modification time in ms) of empty ones).
    Spark's file scans drop empty files, so those are the files the listing (``inputFiles``,
    which keeps them; URIs there) names beyond the scan's rows, each confirmed empty by the
    file system. The names skipped are Spark's: starting with ``.`` or ``_``. No file's
    content is read here."""
    df = (spark.read.format("binaryFile").option("recursiveFileLookup", "true")
          .option("pathGlobFilter", f"*{SUFFIX}").load(literal(landing)))
    listed = [tuple(r) for r in df.selectExpr("path", "length",
                                              "unix_millis(modificationTime)").collect()]
    have = {path_key(p) for p, _, _ in listed}
    empty = []
    for uri in df.inputFiles():
        if uri_key(uri) not in have:
            path, length, mtime = fs.status(uri)
            if length == 0:
                empty.append((path, mtime))
    return listed, sorted(empty)


def literal(path: str) -> str:
    """``path`` with the characters Spark's ``load`` would take for a glob pattern escaped
    (Hadoop's ``\\``): a landing area named ``land[1]`` is that folder, not ``land1``."""
    return "".join("\\" + ch if ch in "\\{}[]*?" else ch for ch in path)


def path_key(p: str) -> str:
    """A path as the scan's rows name it (Hadoop's ``Path.toString``: ``file:/a b#1%41``, not
    escaped) in the form ``uri_key`` gives."""
    scheme, _, rest = p.partition(":")
    if rest.startswith("//"):
        authority, slash, path = rest[2:].partition("/")
        return f"{scheme}://{authority}{slash}{path}"
    return f"{scheme}://{rest}"


def uri_key(uri: str) -> str:
    """A path as ``inputFiles`` names it (a URI: ``file:///a%20b%231%2541``), in one form with
    ``path_key``'s, to compare them by: a file both name is not looked up again."""
    from urllib.parse import unquote, urlsplit
    parts = urlsplit(uri)
    return f"{parts.scheme}://{parts.netloc}{unquote(parts.path)}"
