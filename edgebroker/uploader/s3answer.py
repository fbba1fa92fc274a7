"""The s3 sink's reading of the store's answers (s3.py): an error's code and message, one
element's text, and whether a CompleteMultipartUpload answer holds its result. The body is the
one ``Link.answer`` read (at most 64 KiB, s3link.py), parsed with ``xml.etree``."""

from __future__ import annotations

from xml.etree import ElementTree

from edgebroker.errors import shown
from edgebroker.uploader.sinks import TransientSinkError


def remote(text: str, limit: int = 200) -> str:
    """A store's text as it is when printable and short, else escaped and cut: no controls."""
    return text if text.isprintable() and len(text) <= limit else shown(text, limit)


class Response:
    def __init__(self, status: int, headers: dict[str, str], body: bytes):
        self.status, self.headers, self.body = status, headers, body

    def code(self) -> str:
        """The S3 error code of an error answer ("" when there is none)."""
        return remote(self._element("Code"), 64)

    def message(self) -> str:
        return remote(self._element("Message"))

    def _element(self, tag: str) -> str:
        try:
            return ElementTree.fromstring(self.body).findtext(tag) or ""
        except ElementTree.ParseError:
            return ""


def text_of(body: bytes, tag: str, what: str) -> str:
    """The text of the first ``tag`` element of an XML answer; TransientSinkError naming
    ``what`` (the request) when there is none or the answer is not XML."""
    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError:
        raise TransientSinkError(f"{what}: the store's answer is not XML: {body[:80]!r}"
                                 ) from None
    for el in root.iter():
        if el.tag == tag or el.tag.endswith("}" + tag):
            return el.text or ""
    raise TransientSinkError(f"{what}: no {tag} in the store's answer")


def completed(body: bytes, what: str) -> bool:
    """A CompleteMultipartUpload answered 200: its outcome is in the body (S3 sends the 200
    first, then spaces while it works, then the result or an error). True for a whole
    ``CompleteMultipartUploadResult``, False for an ``Error``; anything else (empty, cut short
    by the connection's end, not XML) is a TransientSinkError naming ``what``: the upload may
    not be complete."""
    try:
        root = ElementTree.fromstring(body.lstrip()).tag.rpartition("}")[2]
    except ElementTree.ParseError:
        root = ""
    if root == "CompleteMultipartUploadResult":
        return True
    if root == "Error":
        return False
    raise TransientSinkError(f"{what}: answered 200 without a complete result: "
                             f"{body[:80]!r}")


__all__ = ["Response", "remote", "text_of", "completed"]
