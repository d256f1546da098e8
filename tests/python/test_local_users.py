"""No local user gets in either (issue 58): tfbarrier's directories are private to the job's user and
swept once their owner is gone (workdirs.py), and a training process loads a job only from such a
directory. The spares' keepers, which another user could reach through Linux's abstract sockets, are
tested in test_spares.py (support/intruder.py)."""

import glob
import json
import os
import stat
import subprocess
import sys
import tempfile
import time

import psutil
import pytest
import tf_keras
from conftest import left_behind

import tfbarrier
from tfbarrier import faults, settings
from tfbarrier.errors import EnvironmentBuildError
from tfbarrier.spark import environment, protocol, workdirs
from tfbarrier.spark.launcher import TrainingProcess

NOBODY = 65534
# Run as root, it becomes nobody, then tries to read each path given: prints one JSON line, a path's
# first byte or the error's name.
AS_NOBODY = """
import json, os, sys
os.setgroups([]); os.setgid(65534); os.setuid(65534)
seen = {}
for path in sys.argv[1:]:
    try:
        seen[path] = sorted(os.listdir(path)) if os.path.isdir(path) else open(path, 'rb').read(1).hex()
    except OSError as exc:
        seen[path] = type(exc).__name__
print(json.dumps(seen))
"""


def read_as_nobody(paths):
    out = subprocess.run([sys.executable, "-c", AS_NOBODY, *paths], capture_output=True, text=True, timeout=60)
    return json.loads(out.stdout)


def ancestors_environ():
    """The environments of this process's ancestors (its task, or the relay and keeper it was forked by), joined."""
    found = []
    for parent in psutil.Process().parents():
        try:
            found.append(json.dumps(parent.environ()))
        except psutil.Error:  # another user's (not readable), or gone
            break
    return "\n".join(found)


class Inspect(tf_keras.callbacks.Callback):
    """In worker 0's training process, once it trains: the modes of its work directory and of the files
    there, of its home (or its keeper's) and of the driver's job directories (local mode: the
    same host), what nobody reads of them, and whether the job's secret is in its environment or its ancestors'
    (its task's). Written to ``out``."""

    def __init__(self, out):
        super().__init__()
        self.out = out

    def on_train_begin(self, logs=None):
        if json.loads(os.environ["TF_CONFIG"])["task"]["index"] != 0:
            return
        workdir = os.path.dirname(os.readlink("/proc/self/fd/1"))  # the log there is its output
        job = protocol.read_pickle(workdir, protocol.JOB_FILE)
        files = [os.path.join(workdir, name) for name in (protocol.JOB_FILE, protocol.LOG_FILE, protocol.SHARD_FILE)]
        # Its home, or the keeper's it was forked from (keeper.py): where it imports tfbarrier from.
        homes = [path for path in sys.path if os.path.basename(path).startswith(("tfbarrier-process-",
                                                                                 "tfbarrier-keeper-"))]
        jobs = glob.glob(os.path.join(tempfile.gettempdir(), "tfbarrier-job-*"))
        task_environ = ancestors_environ()
        seen = {
            "modes": {path: oct(stat.S_IMODE(os.stat(path).st_mode)) for path in [workdir, *files, *homes, *jobs]},
            "dirs": {"workdir": workdir, "homes": homes, "jobs": jobs, "files": files},
            "nobody": read_as_nobody([workdir, *files, *homes, *jobs]),
            "secret_in_environ": job.secret in json.dumps(dict(os.environ)) or job.secret in task_environ,
        }
        with open(self.out, "w") as f:
            json.dump(seen, f)


def test_a_fits_directories_and_files_are_its_users_alone_and_its_secret_in_no_environment(digits_df, tmp_path):
    out = str(tmp_path / "seen.json")
    model = tf_keras.Sequential([tf_keras.Input((64,)), tf_keras.layers.Dense(10, activation="softmax")])
    model.compile("sgd", "sparse_categorical_crossentropy")
    tfbarrier.fit(digits_df, model, features="pixels", label="digit", epochs=1, batch_size=64, num_workers=2,
                  steps_per_epoch=2, callbacks=lambda: [Inspect(out)], verbose=0)
    with open(out) as f:
        seen = json.load(f)
    dirs = seen["dirs"]
    assert dirs["homes"] and dirs["jobs"], dirs  # each kind was found
    for path in [dirs["workdir"], *dirs["homes"], *dirs["jobs"]]:
        assert seen["modes"][path] == "0o700", (path, seen["modes"])
        assert seen["nobody"][path] == "PermissionError", (path, seen["nobody"])
    for path in dirs["files"]:
        assert seen["nobody"][path] == "PermissionError", (path, seen["nobody"])
    assert seen["modes"][dirs["files"][0]] == "0o600"  # the job's pickle
    assert seen["modes"][dirs["files"][1]] == "0o600"  # the process's log
    assert not seen["secret_in_environ"]


def planted_directory(tmp_path, marker):
    """A directory of nobody's holding a job file whose unpickling creates ``marker``."""
    planted = tmp_path / "planted"
    planted.mkdir()
    code = (f"import pickle\nclass Planted:\n    def __reduce__(self):\n        return open, ({str(marker)!r}, 'w')\n"
            f"open({str(planted / protocol.JOB_FILE)!r}, 'wb').write(pickle.dumps(Planted()))\n")
    subprocess.run([sys.executable, "-c", code], check=True)
    os.chown(planted, NOBODY, NOBODY)
    os.chown(planted / protocol.JOB_FILE, NOBODY, NOBODY)
    return str(planted)


def test_a_training_process_never_loads_a_job_from_a_directory_another_user_owns(tmp_path):
    marker = tmp_path / "planted-job-loaded"
    planted = planted_directory(tmp_path, marker)
    with TrainingProcess(dict(os.environ, **settings.TRAINING_ENV)) as process:
        process.adopt(planted, {}, 0, "localhost")
        code = process.wait()
    assert code == faults.EXIT_FAILED
    assert not marker.exists()
    # nothing written there: no error file, and the log adopt() made (as a task does) stayed empty
    assert sorted(os.listdir(planted)) == [protocol.JOB_FILE, protocol.LOG_FILE]
    assert os.path.getsize(os.path.join(planted, protocol.LOG_FILE)) == 0
    assert left_behind() == []


def test_only_a_directory_of_this_user_that_no_other_writes_is_private(tmp_path):
    private = workdirs.make("tfbarrier-test-")
    try:
        assert workdirs.is_private(private)
        assert stat.S_IMODE(os.stat(private).st_mode) == 0o700
        os.symlink(private, tmp_path / "link")
        assert not workdirs.is_private(str(tmp_path / "link"))  # a link to one is not one
        os.chmod(private, 0o777)
        assert not workdirs.is_private(private)
        os.chmod(private, 0o700)
        os.chown(private, NOBODY, NOBODY)
        assert not workdirs.is_private(private)
    finally:
        subprocess.run(["rm", "-rf", private], check=True)


def _state(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def _directory(root, name, owner):
    """A private directory in ``root`` (not the shared temporary directory: sweeping that would race other
    tests' directories) owned by the process ``owner``."""
    directory = os.path.join(root, "tfbarrier-test-" + name)
    os.mkdir(directory, 0o700)
    workdirs.hand_over(directory, owner)
    return directory


def test_a_directory_whose_owner_is_gone_is_swept_and_a_live_owners_kept(tmp_path):
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        gone, kept = _directory(tmp_path, "gone", owner.pid), _directory(tmp_path, "kept", os.getpid())
        open(os.path.join(gone, protocol.LOG_FILE), "w").close()
        assert workdirs.sweep(tmp_path, force=True) == []  # its owner still runs
        owner.kill()
        while _state(owner.pid) != "Z":  # exited, not reaped yet: its parent may not reap it for long
            time.sleep(0.05)
        assert workdirs.sweep(tmp_path, force=True) == [gone]
        assert not os.path.exists(gone) and os.path.isdir(kept)
    finally:
        owner.kill()
        owner.wait()


def test_a_directory_whose_owners_pid_now_names_another_process_is_swept(tmp_path):
    directory = _directory(tmp_path, "reused", os.getpid())
    with open(os.path.join(directory, workdirs.OWNER_FILE), "w") as f:
        f.write(f"{os.getpid()} 1\n")  # this pid, but a process that started at another time
    assert workdirs.sweep(tmp_path, force=True) == [directory]


# In a PID namespace of its own (another container sharing the temporary directory as the same user), a job's
# owner makes its directory in argv[1] as a job does, prints it, and lives until its standard input closes.
OWNER_IN_ANOTHER_CONTAINER = """
import os, sys, tempfile
tempfile.tempdir = sys.argv[1]
from tfbarrier.spark import workdirs
print(workdirs.make("tfbarrier-job-"), os.getpid(), flush=True)
sys.stdin.read()
"""


def test_a_live_directory_of_another_pid_namespaces_owner_is_not_swept(tmp_path):
    owner = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c",
                              OWNER_IN_ANOTHER_CONTAINER, str(tmp_path)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        directory, pid_there = owner.stdout.readline().split()
        assert int(pid_there) < 10  # its pid in its own namespace, which here names another process or none
        assert workdirs.sweep(str(tmp_path), force=True) == []
        assert os.path.isdir(directory)
    finally:
        owner.stdin.close()
        owner.wait(timeout=30)


def test_predicts_copies_of_the_model_are_in_the_applications_own_directory(spark, digits_df):
    from pyspark import SparkFiles

    model = tf_keras.Sequential([tf_keras.Input((64,)), tf_keras.layers.Dense(10, activation="softmax")])
    model.compile("sgd", "sparse_categorical_crossentropy")
    assert len(tfbarrier.predict(digits_df.limit(20), model, features="pixels").collect()) == 20
    directory = os.path.join(SparkFiles.getRootDirectory(), "tfbarrier-models")  # local mode: the executor's too
    copies = [os.path.join(directory, name) for name in os.listdir(directory)]
    assert copies and stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    assert set(read_as_nobody([directory, *copies]).values()) == {"PermissionError"}
    assert not glob.glob(os.path.join(tempfile.gettempdir(), "tfbarrier-models-*"))


# Run as root, it becomes nobody and plants an environment at argv[1] (the environments' directory) for the key
# argv[2]: a marker file and a bin/python that writes argv[3] when anything runs it.
PLANT_AN_ENVIRONMENT = """
import os, sys
os.setgroups([]); os.setgid(65534); os.setuid(65534)
home, key, ran = sys.argv[1:]
target = os.path.join(home, "tfbarrier-" + key)
os.makedirs(os.path.join(target, "bin"), 0o777)
os.chmod(home, 0o777)
open(os.path.join(target, "tfbarrier-env.json"), "w").write("{}")
python = os.path.join(target, "bin", "python")
open(python, "w").write("#!/bin/sh\\ntouch " + ran + "\\nexec " + sys.executable + " \\"$@\\"\\n")
os.chmod(python, 0o755)
"""


@pytest.fixture
def shared_tmp(monkeypatch):
    """A temporary directory shared by every local user (1777, as /tmp is), this process's for the test."""
    shared = tempfile.mkdtemp(prefix="shared-tmp-", dir="/tmp")
    os.chmod(shared, 0o1777)
    monkeypatch.setattr(tempfile, "tempdir", shared)
    yield shared
    subprocess.run(["rm", "-rf", shared], check=True)


def test_an_environment_another_user_planted_where_the_cache_lives_is_refused_and_never_run(shared_tmp):
    env = environment.PythonEnv(requirements=["tfbarrier-probe==1.0"])
    ran = os.path.join(shared_tmp, "planted-python-ran")
    subprocess.run([sys.executable, "-c", PLANT_AN_ENVIRONMENT, env.home(), env.key(), ran], check=True, timeout=60)
    with pytest.raises(EnvironmentBuildError) as refused:
        python, _ = environment.ensure(env)
        subprocess.run([python, "-c", "pass"], timeout=60)  # what the task does with it: its training process
    assert env.home() in str(refused.value) and "nobody" in str(refused.value)
    assert "workon_home" in str(refused.value)  # the fix
    assert not os.path.exists(ran)


@pytest.mark.parametrize("how", ["another_users", "others_may_write", "a_link", "in_a_directory_others_may_write"])
def test_a_workon_home_not_this_users_alone_is_refused_naming_it(tmp_path, how):
    home = tmp_path / "envs"
    if how == "a_link":
        (tmp_path / "elsewhere").mkdir()
        home.symlink_to(tmp_path / "elsewhere")
    elif how == "in_a_directory_others_may_write":  # where another user could put a home of theirs in its place
        (tmp_path / "open").mkdir()
        os.chmod(tmp_path / "open", 0o777)
        home = tmp_path / "open" / "envs"
        home.mkdir(mode=0o700)
    else:
        home.mkdir(mode=0o700)
        os.chown(home, NOBODY, NOBODY) if how == "another_users" else os.chmod(home, 0o777)
    env = environment.PythonEnv(workon_home=str(home))
    with pytest.raises(EnvironmentBuildError) as refused:
        environment.ensure(env)
    assert ("the directory above the environments" if how.startswith("in_") else "environments' directory") \
        in str(refused.value)
    assert not os.path.exists(tmp_path / "elsewhere" / f"tfbarrier-{env.key()}")


def test_the_default_environment_cache_is_this_users_and_private(shared_tmp):
    env = environment.PythonEnv()
    python, info = environment.ensure(env)  # no requirements: a bare venv, built in a second or two
    home = env.home()
    assert home == os.path.join(shared_tmp, f"tfbarrier-envs-{os.geteuid()}")
    assert stat.S_IMODE(os.stat(home).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(os.path.join(home, environment.BUILD_LOG)).st_mode) == 0o600
    assert info["built"] and python.startswith(home + os.sep)
    assert read_as_nobody([home]) == {home: "PermissionError"}
    assert workdirs.leftovers(shared_tmp) == []  # a cache, not a leftover: never swept
