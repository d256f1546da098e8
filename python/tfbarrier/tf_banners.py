"""TensorFlow's start-up banners kept off the console: on the driver (R's console, a script's stderr)
and at the top of every training process's log, which is what a WorkerError shows first.

Importing TensorFlow 2.21 writes, from C++ and whatever TF_CPP_MIN_LOG_LEVEL says, absl's
"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR" and
INFO lines (oneDNN, CPU features), twice. ``install()`` (run by ``import tfbarrier``) makes the first
import of ``tensorflow`` in this process write its stderr to a file, then replays every line but
these. TF_CPP_MIN_LOG_LEVEL=0 (asking for TensorFlow's INFO logs) keeps them.
"""

import contextlib
import importlib.abc
import importlib.util
import os
import re
import sys
import tempfile

_BANNER = re.compile(
    rb"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    rb"|I\d{4} [\d:.]+ +\d+ \S+:\d+\] "  # an absl INFO line: I0000 00:00:1795369571.873013  12925 port.cc:153]
    rb"|To enable the following instructions: "  # the second line of cpu_feature_guard's INFO
)


@contextlib.contextmanager
def banners_filtered():
    """While inside, file descriptor 2 goes to a temporary file; on leaving, its lines but the
    banners go to the real stderr."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no stderr to filter
        yield
        return
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().splitlines(keepends=True) if not _BANNER.match(line)]
            if kept:
                os.write(2, b"".join(kept))


class _FirstTensorFlowImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: it wraps the loader of ``tensorflow`` in ``banners_filtered``, once."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        uninstall()
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_quietly(module):
            with banners_filtered():
                exec_module(module)

        spec.loader.exec_module = exec_quietly  # this spec's own loader object, made for this import
        return spec


_finder = _FirstTensorFlowImport()


def install():
    """Filter the banners of this process's first TensorFlow import, if it is still to come."""
    wanted = os.environ.get("TF_CPP_MIN_LOG_LEVEL") != "0" and "tensorflow" not in sys.modules
    if wanted and _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def uninstall():
    with contextlib.suppress(ValueError):
        sys.meta_path.remove(_finder)
