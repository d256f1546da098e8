"""What crosses the driver link (driver_link.py), whichever end speaks: a connection's proof that it holds
the job's token, and a file streamed into place, hashed as it comes.

A connection opens with the server's nonce (one JSON line); the task answers with its hello, which carries
``proof``: an HMAC-SHA256 under the token of the nonce and the rest of the hello, so the token never crosses
and a recorded hello proves nothing on another connection. A file streams in as its bytes come, written aside,
and is put in place only when its SHA-256 is the one the receiver was told to expect.
"""

import hashlib
import hmac
import json
import os
import socket

from tfbarrier import atomic, settings

COPY_CHUNK = 2**20  # bytes read and written at a time while a file streams in
HELLO_LIMIT = 2**16  # bytes of a connection's first line (its hello, or the nonce) read before its proof is checked
NONCE_BYTES = 32


class DigestMismatch(ConnectionError):
    """A file's bytes are not the ones its digest names: changed on the way."""


def proof(token, nonce, hello):
    """What a connection sends to show it holds ``token``: an HMAC of the server's ``nonce`` and its ``hello``."""
    canonical = json.dumps(hello, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(token.encode(), b"tfbarrier-link" + nonce + canonical, hashlib.sha256).hexdigest()


def connect(endpoint):
    """A connection to the driver's link, TLS when its endpoint pins a certificate."""
    sock = socket.create_connection((endpoint["host"], endpoint["port"]), timeout=settings.CONNECT_TIMEOUT)
    tls = endpoint.get("tls")
    if tls is None:
        return sock
    try:
        return tls.client(sock)
    except OSError:
        sock.close()
        raise


def open_proved(endpoint, **hello):
    """A connection to the driver's link that proved the token with ``hello``: (socket, a reader of what the
    server says). OSError when it cannot."""
    sock = connect(endpoint)
    try:
        answers = sock.makefile("rb")
        try:
            nonce = bytes.fromhex(json.loads(answers.readline(HELLO_LIMIT))["nonce"])
        except (ValueError, KeyError, TypeError):
            raise ConnectionError("the driver's link sent no nonce: not the driver, or it refused this "
                                  "connection") from None
        sock.sendall(json.dumps({**hello, "proof": proof(endpoint["token"], nonce, hello)}).encode() + b"\n")
        return sock, answers
    except OSError:
        sock.close()
        raise


def copy_into(source, path, size, sha256=None):
    """``size`` bytes of ``source`` (a binary reader) into a new file at ``path``, a chunk at a time: their
    SHA-256 (hex). With ``sha256``, the file is put in place only when it is that."""
    digest = hashlib.sha256()
    with atomic.written_aside(path) as f:
        left = size
        while left:
            chunk = source.read(min(COPY_CHUNK, left))
            if not chunk:
                raise ConnectionError(f"the connection closed {size - left} of {size} bytes into {path!r}")
            f.write(chunk)
            digest.update(chunk)
            left -= len(chunk)
        if sha256 is not None and digest.hexdigest() != sha256:
            raise DigestMismatch(f"{os.path.basename(path)!r} came with SHA-256 {digest.hexdigest()[:16]}..., not the "
                                 f"{sha256[:16]}... its job carries: changed on the way")
    return digest.hexdigest()
