"""TLS for a job's own traffic when the cluster encrypts: the driver link, transfers and the training processes'
ring. Which jobs must encrypt is the cluster's to say (spark/preflight.py).

A job that must encrypt makes a self-signed certificate and its key on the driver and carries both in
the job, which Spark ships encrypted when its own encryption is on (the job's secret travels the same
way). Every end that listens (the driver's link, a training process admitting its ring neighbour)
presents that certificate; every end that connects trusts it and nothing else (pinned, no host names).
TLS keeps the bytes from being read or changed on the network; who may talk is still decided inside
the channel, by the job's token or secret, as without TLS.
"""

import contextlib
import datetime
import os
import ssl
import tempfile
import threading


LIFETIME = datetime.timedelta(days=3650)  # outlives any job (its retries too): the key dies with the job anyway


class Credentials:
    """A job's certificate and key (PEM bytes), and the TLS contexts made from them."""

    def __init__(self, certificate, key):
        self.certificate, self._key = certificate, key
        self._contexts, self._lock = {}, threading.Lock()

    @classmethod
    def new(cls, name="tfbarrier job"):
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.timezone.utc)
        certificate = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                       .public_key(key.public_key()).serial_number(x509.random_serial_number())
                       .not_valid_before(now - datetime.timedelta(days=1))  # executors' clocks may lag
                       .not_valid_after(now + LIFETIME)
                       .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                       .sign(key, hashes.SHA256()))
        return cls(certificate.public_bytes(serialization.Encoding.PEM),
                   key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption()))

    def __getstate__(self):
        return {"certificate": self.certificate, "key": self._key}

    def __setstate__(self, state):
        self.__init__(state["certificate"], state["key"])

    def __repr__(self):
        return "Credentials(<job certificate>)"

    def pinned(self):
        """Only the certificate: what an end that connects needs (the driver link's endpoint)."""
        return Credentials(self.certificate, None)

    def server(self, sock):
        """``sock`` (accepted) wrapped as the listening end: the handshake runs now, within its timeout."""
        return self._context(ssl.PROTOCOL_TLS_SERVER).wrap_socket(sock, server_side=True)

    def client(self, sock):
        """``sock`` (connected) wrapped as the connecting end, which trusts only the job's certificate."""
        return self._context(ssl.PROTOCOL_TLS_CLIENT).wrap_socket(sock)

    def _context(self, protocol):
        with self._lock:
            if protocol not in self._contexts:
                self._contexts[protocol] = self._make_context(protocol)
            return self._contexts[protocol]

    def _make_context(self, protocol):
        context = ssl.SSLContext(protocol)
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        if protocol == ssl.PROTOCOL_TLS_CLIENT:
            context.check_hostname = False  # pinned: the job's certificate is the only one trusted
            context.load_verify_locations(cadata=self.certificate.decode())
            return context
        if self._key is None:
            raise ValueError("these credentials hold no key: they cannot listen")
        with _key_file(self._key + self.certificate) as path:  # Python's ssl loads keys from files only
            context.load_cert_chain(path)
        return context


@contextlib.contextmanager
def _key_file(pem):
    """A path holding ``pem`` while the block runs: a file in memory (Linux's memfd), which no other user
    opens and which a killed process leaves nowhere; elsewhere a file in a 0700 temporary directory."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("tfbarrier-tls", os.MFD_CLOEXEC)
        try:
            os.write(fd, pem)
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="tfbarrier-tls-") as scratch:
        path = os.path.join(scratch, "job.pem")
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
            f.write(pem)
        yield path


def describe(sock):
    """How ``sock`` is encrypted: its TLS version and cipher ("TLSv1.3 TLS_AES_256_GCM_SHA384"), or None."""
    cipher = getattr(sock, "cipher", None)
    used = cipher() if cipher is not None else None  # None also once the socket closed
    return None if used is None else f"{used[1]} {used[0]}"
