"""A request's body, read whole as its client framed it, within a size bound: what the sampler forwards and copies.

Why whole: the body goes to TEI with its length stated (a chunked one too: TEI reads either, and the copy for the
guard needs the bytes anyway), and a rerank request is small; ``max_body_bytes`` mirrors TEI's own
``--payload-limit`` (413 beyond it), so nothing TEI would take is refused here and nothing larger is held.

Why strict: the sampler is a proxy, and a body whose framing two hops could read differently is how requests are
smuggled (RFC 9112 section 6.3). So ``Content-Length`` must be one plain decimal number, ``Transfer-Encoding`` only
``chunked`` and never with a ``Content-Length``; anything else is refused before a byte of the body is read
(:class:`Refused`: 400, 413 or 501, and the connection closed, since what was not read must not be taken as a next
request). A client that leaves or stalls within its body gets no answer (:class:`Gone`).
"""

from __future__ import annotations

import re
from email.message import Message
from io import BufferedIOBase

_DECIMAL = re.compile(rb"[0-9]{1,15}")
_HEX = re.compile(rb"[0-9A-Fa-f]{1,8}")
#: The longest chunk-size or trailer line, and the most trailer lines, taken.
MAX_LINE = 1024
MAX_TRAILERS = 64


class Refused(Exception):
    """The body is not taken: the status and the reason to answer."""

    def __init__(self, status: int, error: str) -> None:
        super().__init__(error)
        self.status, self.error = status, error


class Gone(Exception):
    """The client left, or stalled past its timeout, before its body arrived."""


def read_body(headers: Message, rfile: BufferedIOBase, max_bytes: int) -> bytes | None:
    """The whole body (None: the request states none). Raises :class:`Refused` or :class:`Gone`."""
    codings = headers.get_all("Transfer-Encoding")
    if codings:
        if [c.strip().lower() for c in ",".join(codings).split(",")] != ["chunked"]:
            raise Refused(501, "only the chunked transfer coding is taken")
        if "Content-Length" in headers:  # two framings: which one the next hop believes is a guess
            raise Refused(400, "Content-Length and Transfer-Encoding together")
        return _chunked(rfile, max_bytes)
    stated = headers.get_all("Content-Length") or []
    if not stated:
        return None
    if len(stated) > 1 or not _DECIMAL.fullmatch(str(stated[0]).encode("latin-1")):
        raise Refused(400, "Content-Length must be one decimal number")
    length = int(stated[0])
    if length > max_bytes:
        raise Refused(413, f"the body is larger than {max_bytes} bytes")
    return _exactly(rfile, length)


def _exactly(rfile: BufferedIOBase, length: int) -> bytes:
    try:
        data = rfile.read(length)
    except OSError:  # stalled past the client timeout, or reset
        raise Gone() from None
    if len(data) < length:
        raise Gone()
    return data


def _chunked(rfile: BufferedIOBase, max_bytes: int) -> bytes:
    parts: list[bytes] = []
    total = 0
    while True:
        size_text = _line(rfile).split(b";", 1)[0].strip()
        if not _HEX.fullmatch(size_text):
            raise Refused(400, "a chunk's size must be hexadecimal")
        size = int(size_text, 16)
        if size == 0:
            break
        total += size
        if total > max_bytes:
            raise Refused(413, f"the body is larger than {max_bytes} bytes")
        parts.append(_exactly(rfile, size))
        if _line(rfile):
            raise Refused(400, "a chunk must end with CRLF")
    for _ in range(MAX_TRAILERS):  # trailers: read and dropped (TEI reads none)
        if not _line(rfile):
            return b"".join(parts)
    raise Refused(400, "too many trailer fields")


def _line(rfile: BufferedIOBase) -> bytes:
    try:
        line = rfile.readline(MAX_LINE + 1)
    except OSError:
        raise Gone() from None
    if not line.endswith(b"\n"):
        if len(line) > MAX_LINE:
            raise Refused(400, "a chunk line is too long")
        raise Gone()
    return line.rstrip(b"\r\n")
