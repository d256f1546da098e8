"""Files written aside and renamed into place once whole, so that a reader (another worker, a resumed
attempt, a concurrent task) never sees half a file and a failed write leaves the old one. Standard library
only; a training process passes TensorFlow's file systems (``gfile``) to reach object stores and HDFS."""

import contextlib
import os
import threading
import types


def private_file(path, mode="wb"):
    """``open(path, mode)`` for writing ("a" in ``mode``: appending), the file created 0600 whatever the umask
    (its directory says who else may read it), never through a link someone put at ``path``."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_APPEND if "a" in mode else os.O_TRUNC)
    return open(os.open(path, flags, 0o600), mode)


LOCAL = types.SimpleNamespace(open=private_file, rename=os.replace, exists=os.path.exists, remove=os.unlink)


def gfile(tf):
    """TensorFlow's file systems (any path tf.io.gfile reaches), for ``written_aside``'s ``fs``. A rename
    is atomic on local and POSIX file systems; object stores copy."""
    io = tf.io.gfile
    return types.SimpleNamespace(open=io.GFile, rename=lambda a, b: io.rename(a, b, overwrite=True),
                                 exists=io.exists, remove=io.remove)


@contextlib.contextmanager
def written_aside(path, mode="wb", fs=LOCAL):
    """A file open for writing beside ``path`` (``mode``: "wb" or "w"); once the block ends it replaces
    ``path``. When the block fails, ``path`` is untouched and the scratch file removed."""
    scratch = f"{path}.part-{os.getpid()}-{threading.get_ident()}"
    try:
        with fs.open(scratch, mode) as f:
            yield f
        fs.rename(scratch, path)
    finally:
        if fs.exists(scratch):
            fs.remove(scratch)
