"""The Python environment of the training processes: the executor's own Python, a virtualenv each
executor builds (cached and locked), or an environment packed on the driver and shipped as a Spark
archive.

Runs in the barrier task before TensorFlow exists on that host: standard library only.

A built environment lives in ``<workon_home>/tfbarrier-<hash>``, the hash covering everything that
defines it (Python version, sorted requirements, index options, system_site_packages). One builder
per environment and host at a time (a file lock); it builds in a temporary directory and renames it
into place once pip succeeded and the completion marker is written, so a half-built environment is
never used, and a directory without the marker is removed and rebuilt. Every build appends a line to
``<workon_home>/tfbarrier-builds.log``.

An environment's ``bin/python`` runs as the executor's user, so only that user may have made it: the
home is this user's alone (by default ``<tmp>/tfbarrier-envs-<uid>``, made 0700), checked before each use
(``private_home``: owned by this user, written by no other, no link on the way), and so is every
environment in it; the lock and the log are opened without following links.
"""

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import pwd
import shutil
import site
import socket
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time

from tfbarrier import atomic, settings
from tfbarrier.errors import EnvironmentBuildError, InvalidArgumentError
from tfbarrier.settings import BUILD_TIMEOUT, WORKON_HOME_ENV
from tfbarrier.spark import workdirs

MARKER = "tfbarrier-env.json"
BUILD_LOG = "tfbarrier-builds.log"


@dataclasses.dataclass(frozen=True)
class PythonEnv:
    """Where the training processes' Python comes from (see the module's docstring): a virtualenv each host
    builds once with exactly these requirements, or an environment packed on the driver (``from_archive``).

    Parameters
    ----------
    requirements : list of str
        pip requirement strings.
    workon_home : str, optional
        Where environments live: a directory of the executor's user alone. Default: $WORKON_HOME, else
        ``<tmp>/tfbarrier-envs-<uid>`` in the system temp dir.
    find_links, index_url, no_index
        Passed to pip: a wheelhouse directory or URL, a private index, offline builds.
    system_site_packages : bool
        The environment also sees the executor Python's packages.
    """

    requirements: tuple = ()
    workon_home: str = None
    find_links: tuple = ()
    index_url: str = None
    no_index: bool = False
    system_site_packages: bool = False
    archive: str = None  # set by from_archive: the archive's file name, unpacked by Spark

    def __post_init__(self):
        requirements = (self.requirements,) if isinstance(self.requirements, str) else tuple(self.requirements)
        find_links = (self.find_links,) if isinstance(self.find_links, str) else tuple(self.find_links or ())
        if not all(isinstance(r, str) and r.strip() for r in requirements):
            raise InvalidArgumentError("requirements must be a list of pip requirement strings")
        object.__setattr__(self, "requirements", requirements)
        object.__setattr__(self, "find_links", find_links)

    @classmethod
    def from_archive(cls, path):
        """An environment packed on the driver (venv-pack / conda-pack style .tar.gz, .tgz or .zip with
        ``bin/python`` at its top), shipped to every executor with Spark's archive distribution."""
        if not os.path.isfile(path):
            raise InvalidArgumentError(f"no environment archive at {path!r}: pack one first (e.g. venv-pack)")
        return cls(archive=os.path.abspath(path))

    def options(self):
        args = [arg for link in self.find_links for arg in ("--find-links", link)]
        if self.index_url:
            args += ["--index-url", self.index_url]
        if self.no_index:
            args.append("--no-index")
        return args

    def key(self):
        """The content hash naming this environment for this Python."""
        identity = {
            "python": sys.version_info[:3],
            "requirements": sorted(self.requirements),
            "pip": self.options(),
            "system_site_packages": self.system_site_packages,
        }
        return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]

    def home(self):
        default = os.path.join(tempfile.gettempdir(), f"{workdirs.CACHE_PREFIX}{os.geteuid()}")
        return os.path.abspath(os.path.expanduser(self.workon_home or os.environ.get(WORKON_HOME_ENV) or default))


def _python(prefix):
    return os.path.join(prefix, "Scripts" if os.name == "nt" else "bin", "python")


class _Lock:
    """An exclusive lock file, waited for (at most ``timeout`` s) while another task builds."""

    def __init__(self, path, timeout):
        self.path, self.timeout = path, timeout

    def __enter__(self):
        self.file = atomic.private_file(self.path, "a")
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if time.monotonic() > deadline:
                    self.file.close()
                    raise EnvironmentBuildError(f"waited {self.timeout} s for another task's environment build "
                                                f"({self.path}) on {socket.gethostname()}") from None
                time.sleep(settings.FILE_POLL)

    def __exit__(self, *exc):
        fcntl.flock(self.file, fcntl.LOCK_UN)
        self.file.close()


def _user(uid):
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _refuse(path, info, what, host):
    raise EnvironmentBuildError(
        f"{what} {path} on {host} belongs to {_user(info.st_uid)} (mode {stat.S_IMODE(info.st_mode):o}), not to "
        f"{_user(os.geteuid())} alone: the training processes would run a Python that another user could have put "
        "there. Remove it, or give PythonEnv a workon_home of this user's own", host=host)


def _unwritable_by_others(info):
    """Whether only a directory's owner may change what is in it (or, sticky like /tmp, only what is their own)."""
    return not info.st_mode & 0o022 or bool(info.st_mode & stat.S_ISVTX)


def private_home(home, host):
    """``home`` made (0700) if missing, and checked: a directory (not a link) this user owns that no other
    user may write to, under directories that only their owners may change (root, this user, or the user that
    runs the cluster's containers: YARN's directories are its). EnvironmentBuildError otherwise."""
    os.makedirs(os.path.dirname(home), 0o700, exist_ok=True)
    parent = os.path.realpath(os.path.dirname(home))
    ancestor = parent
    while True:
        info = os.stat(ancestor)
        if not _unwritable_by_others(info):
            _refuse(ancestor, info, "the directory above the environments", host)
        if ancestor == os.path.dirname(ancestor):
            break
        ancestor = os.path.dirname(ancestor)
    home = os.path.join(parent, os.path.basename(home))
    with contextlib.suppress(FileExistsError):
        os.mkdir(home, 0o700)
    info = os.lstat(home)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        _refuse(home, info, "the environments' directory", host)
    return home


def _check_built(target, host):
    """A built environment (its directory, marker and bin/) is this user's alone: in a home of this user's only
    such ones are, unless an older tfbarrier made the home."""
    for path in (target, os.path.join(target, MARKER), os.path.dirname(_python(target))):
        info = os.lstat(path)
        if info.st_uid != os.geteuid() or info.st_mode & 0o022 or stat.S_ISLNK(info.st_mode):
            _refuse(path, info, "the environment's", host)


def _parent_site_packages(prefix):
    """Make a new environment see this (virtual) environment's packages too: venv's
    --system-site-packages reaches only the base interpreter's."""
    paths = [p for p in site.getsitepackages() if os.path.isdir(p)]
    target = sysconfig.get_paths(vars={"base": prefix, "platbase": prefix})["purelib"]
    with open(os.path.join(target, "_tfbarrier_parent.pth"), "w") as f:
        f.write("\n".join(paths) + "\n")


def _build(env, building, host):
    command = [sys.executable, "-m", "venv", building]
    if env.system_site_packages:
        command.insert(3, "--system-site-packages")
    subprocess.run(command, check=True, capture_output=True, timeout=BUILD_TIMEOUT)
    if env.system_site_packages and sys.prefix != sys.base_prefix:
        _parent_site_packages(building)
    if not env.requirements:
        return
    pip = [_python(building), "-m", "pip", "install", "--disable-pip-version-check", *env.options(), *env.requirements]
    try:
        out = subprocess.run(pip, capture_output=True, text=True, timeout=BUILD_TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        raise EnvironmentBuildError(f"pip ran over {BUILD_TIMEOUT} s on {host} installing {list(env.requirements)}",
                                    host=host) from exc
    if out.returncode != 0:
        tail = "\n".join((out.stdout + out.stderr).strip().splitlines()[-settings.PIP_TAIL_LINES:])
        raise EnvironmentBuildError(
            f"building the environment on {host} failed: pip could not install {list(env.requirements)} "
            f"(pip options {env.options()}); last lines of pip's output:\n{tail}",
            host=host, log=tail,
        )


def ensure(env):
    """The interpreter for the training process and what it took: (python, info). Builds the
    environment if this host has no finished copy of it."""
    started = time.time()
    host = socket.gethostname()
    home = private_home(env.home(), host)
    target = os.path.join(home, f"tfbarrier-{env.key()}")
    marker = os.path.join(target, MARKER)
    info = {"path": target, "built": False}
    if not os.path.exists(marker):
        with _Lock(target + ".lock", BUILD_TIMEOUT):
            if not os.path.exists(marker):  # not built by the task that held the lock before us
                shutil.rmtree(target, ignore_errors=True)  # a half-built leftover is never used
                building = tempfile.mkdtemp(prefix=f"tfbarrier-{env.key()}.building-", dir=home)
                try:
                    _build(env, building, host)
                    with open(os.path.join(building, MARKER), "w") as f:
                        json.dump({"requirements": list(env.requirements), "built_at": time.time(), "host": host}, f)
                    os.rename(building, target)
                finally:
                    shutil.rmtree(building, ignore_errors=True)
                with atomic.private_file(os.path.join(home, BUILD_LOG), "a") as f:
                    f.write(f"{time.time():.3f} {host} {os.getpid()} {target}\n")
                info["built"] = True
    _check_built(target, host)
    info["seconds"] = time.time() - started
    return _python(target), info


def from_archive(env):
    """The interpreter inside the archive Spark unpacked for this executor."""
    from pyspark import SparkFiles

    root = SparkFiles.get(os.path.basename(env.archive))
    python = _python(root)
    if not os.path.exists(python):
        raise EnvironmentBuildError(f"the environment archive {os.path.basename(env.archive)} has no bin/python "
                                    f"at its top (unpacked at {root} on {socket.gethostname()})")
    return python, {"path": root, "built": False, "seconds": 0.0}


def resolve(env):
    """(python, info) for the job's environment; (None, None) means the executor's own Python."""
    if env is None:
        return None, None
    return from_archive(env) if env.archive else ensure(env)
