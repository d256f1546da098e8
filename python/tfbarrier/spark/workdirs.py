"""tfbarrier's own directories in the temporary directory (a task's work directory, a training process's
or a spare keeper's home, the driver's job directory): private to the user that made them, with a record
of the process that owns them, and swept once that process is gone.

A directory is ``mkdtemp``'s (0700: no other local user lists, reads or writes it) and its files are
written 0600. Its owner removes it when it ends; a process killed outright (SIGKILL, PR_SET_PDEATHSIG,
a lost executor) cannot, so ``sweep`` removes, at the next start on the host, every directory of this
user whose owner (its pid and start time, in OWNER_FILE) no longer runs. A process that loads what is
in such a directory (a training process reading its job) first checks that it is one (``is_private``).
"""

import contextlib
import os
import shutil
import stat
import tempfile
import time

from tfbarrier import atomic

PREFIX = "tfbarrier-"
CACHE_PREFIX = "tfbarrier-envs-"  # environment.py's cache of built environments: kept across jobs, never swept
# "PID START PIDNS": the owning process, its start time (a reused pid is not it) and its PID namespace (a pid
# names that process only there: another container sharing this directory as the same user leaves it alone)
OWNER_FILE = ".owner"
SWEEP_EVERY = 60.0  # seconds: a process sweeps at most this often

_last_sweep = [0.0]


def make(prefix):
    """A new private directory ``<tmp>/<prefix>XXXX``, owned by this process."""
    directory = tempfile.mkdtemp(prefix=prefix)
    hand_over(directory, os.getpid())
    return directory


def hand_over(directory, pid):
    """Make the process ``pid`` the directory's owner (a process started to use it, that removes it)."""
    with atomic.private_file(os.path.join(directory, OWNER_FILE), "w") as f:
        f.write(f"{pid} {_start_time(pid)} {_pid_namespace('self')}\n")


def is_private(path):
    """Whether ``path`` is a directory (not a link to one) of this user that no other user can write:
    what a process may load pickles from."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o022


def _stat(pid):
    """The fields of /proc/PID/stat after the process's name (Linux): [0] its state, [19] its start time in
    clock ticks since boot; None where they cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _start_time(pid):
    """The process's start time, or 0 where it cannot be read."""
    fields = _stat(pid)
    try:
        return int(fields[19])
    except (TypeError, ValueError, IndexError):
        return 0


def _pid_namespace(pid):
    """The inode of ``pid``'s PID namespace ("self": this process's), or 0 where it cannot be read."""
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return 0


def _owner_alive(directory):
    """False when the directory's owner is gone; True when it runs, or the record cannot be read (a
    directory being made, or one of an older tfbarrier: left alone), or names a process of another PID
    namespace (this one cannot tell: its own sweep will). A zombie is gone: it has exited, and its parent may
    not reap it for long (a Python worker reaps a spare's keeper when it next starts one)."""
    try:
        with open(os.path.join(directory, OWNER_FILE)) as f:
            pid, start, *namespace = (int(part) for part in f.read().split())
    except (OSError, ValueError):
        return True
    if namespace and namespace != [_pid_namespace("self")]:  # (an older tfbarrier's record names none)
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    fields = _stat(pid)
    if fields is None:  # not Linux, or it just ended
        return True
    return fields[0] != "Z" and start in (0, int(fields[19]))


def leftovers(root=None):
    """This user's tfbarrier directories in ``root`` (default the temporary directory)."""
    root = root or tempfile.gettempdir()
    with contextlib.suppress(OSError), os.scandir(root) as entries:
        return [entry.path for entry in entries
                if entry.name.startswith(PREFIX) and not entry.name.startswith(CACHE_PREFIX) and is_private(entry.path)]
    return []


def sweep(root=None, force=False):
    """Remove this user's tfbarrier directories whose owner is gone; the paths removed. At most once per
    SWEEP_EVERY seconds in a process, unless ``force``."""
    now = time.monotonic()
    if not force and now - _last_sweep[0] < SWEEP_EVERY:
        return []
    _last_sweep[0] = now
    removed = [path for path in leftovers(root) if not _owner_alive(path)]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed
