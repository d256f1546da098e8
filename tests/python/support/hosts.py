"""Several Spark hosts on one machine, for tests and benchmarks: a Linux bridge, one network namespace
per host, and a Spark standalone cluster whose workers run inside those namespaces.

    with HostsCluster(hosts=2) as cluster:
        cluster.url, cluster.driver_address, cluster.host_address(0)

What a run makes, every name starting with ``tfbh<id>`` (``id``: 4 hex digits of its own; interface
names stay under Linux's 15 characters):
- the bridge ``tfbh<id>br`` in the root namespace, address 10.213.<n>.1/24, where n is a /24 that no
  address of this machine and no other live run uses. The master and the driver bind this address.
- per host i, the network namespace ``tfbh<id>h<i>``: loopback up, and a veth pair to the bridge
  (``tfbh<id>h<i>`` on the bridge, ``tfbh<id>n<i>`` inside with the host's address 10.213.<n>.<10 + i>);
- with ``spark`` (the default), a standalone master on the bridge's address and per host a worker started
  inside its namespace (``ip netns exec``, SPARK_LOCAL_IP and ``--host`` its address, ``cores`` cores and
  ``memory``), with its own directories under ``host_dir(i)``: work, Spark's local dirs and TMPDIR (a
  task's temporary files, a PythonEnv built in the default place among them, are per host; WORKON_HOME
  is removed from its environment). ``env(i)``: more environment for host i's worker and executors.

Namespaces share the machine's filesystem: a directory of the run (``dir``) is one every host sees.

Every process the run starts has TFBARRIER_HOSTS_RUN=<id> in its environment, which executors, their
Python workers and training processes inherit. Before it makes anything, a run writes
/run/tfbarrier-hosts/<id>.json naming its creator (pid and start time). Its cleanup, from __exit__, an
atexit hook and SIGTERM/SIGHUP (SIGINT is Python's KeyboardInterrupt, which leaves the ``with``), stops
the Spark daemons, kills every process in its namespaces and every process of the run, deletes the
namespaces, links and bridge, the run's directory, then the state file. ``sweep()`` (run by every
cluster as it starts, or ``python -m support.hosts sweep``) does the same for the runs whose creator is
gone (killed by SIGKILL), and removes namespaces and links with the prefix that no state file claims.

Controls for fault tests: ``cut(i)`` / ``restore(i)`` (host i's link down / up), ``shape(i, rate)``
(a ``tc tbf`` rate limit both ways, e.g. "100mbit"; None removes it), ``stop_host(i)`` (kill every
process in host i's namespace: its worker and executors), ``start_host(i)`` (a new Spark worker there),
``popen(i, argv)`` (a command on host i); ``transfer_rate(cluster, a, b, nbytes)`` times a TCP stream
from host a to host b. Other processes (a driver program, a fault callback in a training process) ask
for a control with ``request(directory, control, host_address)``, which the test's
``cluster.serve(directory)`` (an ``Operator``) runs at once, answering with the time it did.
"""

import atexit
import contextlib
import fcntl
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time

from support.standalone import StandaloneCluster

PREFIX = "tfbh"
RUN_ENV = "TFBARRIER_HOSTS_RUN"
STATE_DIR = "/run/tfbarrier-hosts"
SUBNET = "10.213.{}"  # .0/24: the bridge is .1, host i is .(10 + i)
_NAME = re.compile(PREFIX + r"([0-9a-f]{4})(br|h\d+|n\d+)$")
KILL_WAIT = 10.0  # for killed processes to be gone


def available():
    """(True, "") where this process can make network namespaces, else (False, why not)."""
    if not sys.platform.startswith("linux"):
        return False, "network namespaces are Linux's"
    missing = [tool for tool in ("ip", "tc", "unshare") if shutil.which(tool) is None]
    if missing:
        return False, f"{', '.join(missing)} not installed (iproute2, util-linux)"
    probe = subprocess.run(["unshare", "--net", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return False, f"cannot make a network namespace: {probe.stderr.strip()} (needs root / CAP_NET_ADMIN)"
    return True, ""


def _ip(*args, check=True):
    out = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


def _tc(*args):
    out = subprocess.run(["tc", *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"tc {' '.join(args)}: {out.stderr.strip()}")


# ---- what exists on this machine -------------------------------------------------------------------

def namespaces(run_id=""):
    """Network namespaces named with the prefix (and ``run_id``)."""
    names = [line.split()[0] for line in _ip("netns", "list").splitlines() if line.strip()]
    return [n for n in names if n.startswith(PREFIX + run_id) and _NAME.match(n)]


def links(run_id=""):
    """Links of the root namespace named with the prefix (and ``run_id``)."""
    found = []
    for line in _ip("-o", "link", "show").splitlines():
        name = line.split(":", 2)[1].strip().split("@")[0]
        if name.startswith(PREFIX + run_id) and _NAME.match(name):
            found.append(name)
    return found


def _start_time(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def gone(pid):
    """True once ``pid`` is gone or a zombie whose every thread ended (its parent can reap it then: a
    killed JVM's main thread is a zombie while its other threads still exit)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                return False
        return len(os.listdir(f"/proc/{pid}/task")) <= 1
    except (OSError, IndexError):
        return True  # gone


def run_processes(run_id):
    """Live processes (not zombies) whose environment says they belong to run ``run_id``."""
    marker = f"{RUN_ENV}={run_id}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if marker in f.read().split(b"\0") and not gone(int(entry)):
                    found.append(int(entry))
        except OSError:
            pass
    return found


def namespace_pids(namespace):
    """Processes in ``namespace`` (``ip netns pids``), zombies left out."""
    out = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split() if not gone(int(p))]


def _kill(pids, number=signal.SIGKILL, wait=KILL_WAIT):
    """Send ``number`` to ``pids`` and wait until they are gone (or zombies)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, number)
    deadline = time.monotonic() + wait
    while any(not gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return pids


def left_behind(run_id):
    """What of run ``run_id`` is still there: namespaces, links, processes, its state file (a dict of
    lists, empty when all is gone)."""
    state = os.path.join(STATE_DIR, f"{run_id}.json")
    return {"namespaces": namespaces(run_id), "links": links(run_id), "processes": run_processes(run_id),
            "state": [state] if os.path.exists(state) else []}


# ---- state files, the lock, the sweep --------------------------------------------------------------

@contextlib.contextmanager
def _locked():
    """Runs on this machine choose names and subnets, and sweep, one at a time."""
    os.makedirs(STATE_DIR, exist_ok=True)
    lock = os.open(STATE_DIR, os.O_RDONLY)  # the directory itself: no lock file to leave behind
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
    finally:
        os.close(lock)


def _states():
    found = {}
    for entry in os.listdir(STATE_DIR) if os.path.isdir(STATE_DIR) else ():
        if entry.endswith(".json"):
            try:
                with open(os.path.join(STATE_DIR, entry)) as f:
                    found[entry[:-5]] = json.load(f)
            except (OSError, ValueError):
                found[entry[:-5]] = {}
    return found


def _creator_alive(state):
    return bool(state) and _start_time(state.get("pid")) == state.get("pid_start")


def _remove_run(run_id, directory=None):
    """Remove everything of run ``run_id``, in reverse order of making: its processes (those in its
    namespaces, then any other with its marker), its namespaces, links and bridge, its directory and
    its state file. Whatever is already gone is skipped."""
    for namespace in namespaces(run_id):
        _kill(namespace_pids(namespace))
    _kill(run_processes(run_id))
    for namespace in reversed(namespaces(run_id)):
        _ip("netns", "delete", namespace, check=False)
    for link in sorted(links(run_id), key=lambda name: name.endswith("br")):  # the bridge last
        _ip("link", "delete", link, check=False)
    if directory:
        shutil.rmtree(directory, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(STATE_DIR, f"{run_id}.json"))


def sweep():
    """Remove what earlier runs left on this machine: everything of the runs whose creating process is
    gone, and of those whose namespaces or links no state file claims. Returns the run ids it removed."""
    if not os.path.isdir(STATE_DIR) and not namespaces() and not links():
        return []
    with _locked():
        states = _states()
        dead = {run_id: state for run_id, state in states.items() if not _creator_alive(state)}
        unclaimed = {_NAME.match(name).group(1) for name in namespaces() + links()} - set(states)
        for run_id in sorted(set(dead) | unclaimed):
            _remove_run(run_id, dead.get(run_id, {}).get("dir"))
        return sorted(set(dead) | unclaimed)


# ---- cleanup when the creating process ends without leaving the ``with`` ----------------------------

_live = set()  # clusters entered and not yet cleaned up, in this process
_previous_handlers = {}


def _clean_up_all():
    for cluster in list(_live):
        cluster.close()


def _on_signal(number, frame):
    _clean_up_all()
    previous = _previous_handlers.get(number, signal.SIG_DFL)
    if callable(previous):
        previous(number, frame)
        return
    signal.signal(number, signal.SIG_DFL)
    os.kill(os.getpid(), number)  # end as the signal would have ended it


def _install_handlers():
    if _previous_handlers or threading.current_thread() is not threading.main_thread():
        return
    atexit.register(_clean_up_all)
    for number in (signal.SIGTERM, signal.SIGHUP):
        previous = signal.getsignal(number)
        if previous in (signal.SIG_DFL, None) or callable(previous):
            _previous_handlers[number] = previous
            signal.signal(number, _on_signal)


def _bits_per_second(rate):
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmg]?)bit", str(rate).strip().lower())
    if match is None:
        raise ValueError(f"a rate such as '100mbit' or '1gbit', got {rate!r}")
    return float(match.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[match.group(2)]


class HostsCluster(StandaloneCluster):
    """``hosts`` Spark hosts (network namespaces) on a bridge of their own, each with a standalone worker
    of ``cores`` cores and ``memory`` (see the module's docstring); ``rate`` shapes every host's link."""

    dir_prefix = "tfbarrier-hosts-"

    def __init__(self, hosts=2, cores=1, memory="1g", rate=None, spark=True, env=None, timeout=90):
        if not 1 <= hosts <= 240:
            raise ValueError(f"1 to 240 hosts (addresses .10 to .249 of the subnet), got {hosts}")
        super().__init__(workers=hosts, cores=cores, memory=memory, timeout=timeout)
        self.hosts, self.rate, self.spark, self.extra_env = hosts, rate, spark, env
        self.run_id = self.subnet = None
        self._closed = False

    # ---- names and addresses
    @property
    def bridge(self):
        return f"{PREFIX}{self.run_id}br"

    def namespace(self, i):
        return f"{PREFIX}{self.run_id}h{i}"

    def _outer(self, i):  # the veth end on the bridge (root namespace)
        return f"{PREFIX}{self.run_id}h{i}"

    def _inner(self, i):  # the veth end in host i's namespace
        return f"{PREFIX}{self.run_id}n{i}"

    @property
    def driver_address(self):
        """The bridge's address: where the master and the driver listen."""
        return SUBNET.format(self.subnet) + ".1"

    master_host = driver_address

    def host_address(self, i):
        return SUBNET.format(self.subnet) + f".{10 + i}"

    def host_index(self, address):
        """The host whose address is ``address``."""
        for i in range(self.hosts):
            if self.host_address(i) == address:
                return i
        raise ValueError(f"no host of this cluster has the address {address!r}")

    def host_dir(self, i):
        return os.path.join(self.dir, f"host{i}")

    # ---- StandaloneCluster's hooks
    def _worker_host(self, worker):
        return self.host_address(worker)

    def _work_dir(self, worker):
        return os.path.join(self.host_dir(worker), "work")

    def _launcher(self, worker):
        return ["ip", "netns", "exec", self.namespace(worker)]

    def _env(self, worker=None):
        env = super()._env(worker)
        env[RUN_ENV] = self.run_id
        if worker is None:
            env["SPARK_LOCAL_IP"] = self.driver_address
            return env
        env.pop("WORKON_HOME", None)
        home = self.host_dir(worker)
        env.update(SPARK_LOCAL_IP=self.host_address(worker), SPARK_WORKER_DIR=os.path.join(home, "work"),
                   SPARK_LOCAL_DIRS=os.path.join(home, "local"), TMPDIR=os.path.join(home, "tmp"))
        env.update(self.extra_env(worker) if self.extra_env else {})
        return env

    # ---- making and removing
    def _claim(self):
        """Sweep, then choose a run id and a free subnet and write the state file, under the lock."""
        sweep()
        with _locked():
            states = _states()
            taken_ids = set(states) | {_NAME.match(n).group(1) for n in namespaces() + links()}
            self.run_id = next(i for i in iter(lambda: secrets.token_hex(2), None) if i not in taken_ids)
            in_use = {int(m) for m in re.findall(r"inet 10\.213\.(\d+)\.", _ip("-o", "-4", "addr", "show"))}
            in_use |= {s.get("subnet") for s in states.values()}
            self.subnet = next((n for n in range(256) if n not in in_use), None)
            if self.subnet is None:
                raise RuntimeError("every 10.213.<n>.0/24 is in use on this machine")
            state = {"pid": os.getpid(), "pid_start": _start_time(os.getpid()), "subnet": self.subnet,
                     "dir": self.dir, "created": time.time()}
            with open(os.path.join(STATE_DIR, f"{self.run_id}.json"), "w") as f:
                json.dump(state, f)

    def _make_network(self):
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.driver_address}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i in range(self.hosts):
            namespace = self.namespace(i)
            _ip("netns", "add", namespace)
            _ip("-n", namespace, "link", "set", "lo", "up")
            _ip("link", "add", self._outer(i), "type", "veth", "peer", "name", self._inner(i), "netns", namespace)
            _ip("link", "set", self._outer(i), "master", self.bridge, "up")
            _ip("-n", namespace, "addr", "add", f"{self.host_address(i)}/24", "dev", self._inner(i))
            _ip("-n", namespace, "link", "set", self._inner(i), "up")
            os.makedirs(os.path.join(self.host_dir(i), "tmp"), exist_ok=True)
            if self.rate:
                self.shape(i, self.rate)

    def __enter__(self):
        _install_handlers()
        _live.add(self)
        try:
            self._claim()
            self._make_network()
            if self.spark:
                self._start_spark()
        except BaseException:
            self.close()
            raise
        return self

    def close(self):
        """Remove everything this run made (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._stop_spark()
        finally:
            if self.run_id is not None:
                _remove_run(self.run_id, self.dir)
            shutil.rmtree(self.dir, ignore_errors=True)
            _live.discard(self)

    def __exit__(self, *exc):
        self.close()

    # ---- controls
    def names(self):
        """This run's namespaces and root-namespace links."""
        return {"namespaces": namespaces(self.run_id), "links": links(self.run_id)}

    def pids(self, i):
        """The processes on host i."""
        return namespace_pids(self.namespace(i))

    def popen(self, i, argv, **kwargs):
        """Start ``argv`` on host i (its namespace, the run's environment marker set)."""
        env = dict(kwargs.pop("env", None) or os.environ, **{RUN_ENV: self.run_id})
        return subprocess.Popen(["ip", "netns", "exec", self.namespace(i), *argv], env=env, **kwargs)

    def cut(self, i):
        """Host i loses its link: its bridge port goes down (no carrier inside either)."""
        _ip("link", "set", self._outer(i), "down")

    def restore(self, i):
        _ip("link", "set", self._outer(i), "up")

    def shape(self, i, rate, burst=None):
        """Limit host i's link to ``rate`` ("100mbit", "1gbit") in both directions with a token bucket
        (tc tbf, a burst of ``burst`` bytes, by default 10 ms at the rate); None removes the limit."""
        for netns, device in ((None, self._outer(i)), (self.namespace(i), self._inner(i))):
            where = ["-n", netns] if netns else []
            if rate is None:
                subprocess.run(["tc", *where, "qdisc", "del", "dev", device, "root"], capture_output=True)
                continue
            burst = burst or max(int(_bits_per_second(rate) / 8 / 100), 32 * 1024)
            _tc(*where, "qdisc", "replace", "dev", device, "root", "tbf", "rate", str(rate), "burst", str(burst),
                "latency", "50ms")

    def stop_host(self, i, number=signal.SIGKILL):
        """Host i goes away: every process in its namespace (the worker, its executors, their Python
        workers and training processes) gets ``number``; returns their pids once they are gone."""
        return _kill(self.pids(i), number)

    def start_host(self, i):
        """Host i comes back after ``stop_host``: a new Spark worker in its namespace, registered with the
        master (which gives running applications an executor there)."""
        self._start_worker(i)
        self._wait_for(f"worker{i}", "Successfully registered with master")

    def serve(self, directory):
        """An Operator running this cluster's controls for other processes (a driver program) that ask
        through ``directory`` (``request``); stop it with ``close()``."""
        return Operator(self, directory)


# ---- controls asked for by other processes ---------------------------------------------------------
# A driver program, and the training processes of its jobs on the hosts, cannot run the cluster's
# controls: the cluster is the test's. They ask by writing a request file into a directory every host
# sees; the test's Operator runs it at once and answers with the time it was done.
CONTROLS = ("cut", "restore", "shape", "stop_host", "start_host")  # each takes the host first
REQUEST_POLL = 0.02  # seconds between looks for new requests


def _write_json(path, value):
    with open(path + ".part", "w") as f:
        json.dump(value, f)
    os.replace(path + ".part", path)


def request(directory, control, host, *args, wait=120.0):
    """Ask the Operator serving ``directory`` to run ``control(host i, *args)`` on its cluster, for the host
    whose address is ``host``. With ``wait``, wait up to that many seconds for the answer: {"started": and
    "at": the time.time() it began and was done} or {"error": ...}; else return the request's name at
    once. Uses the standard library only: a training process (a fault callback) can ask, with this
    module shipped by value (cloudpickle.register_pickle_by_value)."""
    name = f"{time.time():.6f}-{os.getpid()}-{secrets.token_hex(3)}"
    _write_json(os.path.join(directory, name + ".request"),
                {"control": control, "host": host, "args": list(args), "asked_at": time.time()})
    return answer(directory, name, wait) if wait else name


def answer(directory, name, wait=120.0):
    """The answer to request ``name`` (request's return value with wait=0), waiting up to ``wait`` s."""
    path = os.path.join(directory, name + ".done")
    deadline = time.monotonic() + wait
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no answer to request {name} in {directory} within {wait:.0f} s")
        time.sleep(REQUEST_POLL)
    with open(path) as f:
        return json.load(f)


def answered(directory):
    """Every answered request in ``directory``, in order: {"control", "host", "args", "asked_at", "started"
    and "at", or "error"}."""
    found = []
    for entry in sorted(os.listdir(directory)):
        if entry.endswith(".done"):
            with open(os.path.join(directory, entry[:-5] + ".request")) as f:
                asked = json.load(f)
            with open(os.path.join(directory, entry)) as f:
                found.append({**asked, **json.load(f)})
    return found


class Operator:
    """Runs the requests written into ``directory`` (``request``) on ``cluster``, one at a time and in
    order, in a thread of its own, as soon as they appear; only the controls in CONTROLS."""

    def __init__(self, cluster, directory):
        self.cluster, self.directory = cluster, directory
        os.makedirs(directory, exist_ok=True)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hosts-operator", daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            for entry in sorted(os.listdir(self.directory)):
                name = entry[:-len(".request")]
                if entry.endswith(".request") and not os.path.exists(os.path.join(self.directory, name + ".done")):
                    self._do(name)
            self._stop.wait(REQUEST_POLL)

    def _do(self, name):
        with open(os.path.join(self.directory, name + ".request")) as f:
            asked = json.load(f)
        started = time.time()
        try:
            if asked["control"] not in CONTROLS:
                raise ValueError(f"not a control: {asked['control']!r} (one of {', '.join(CONTROLS)})")
            getattr(self.cluster, asked["control"])(self.cluster.host_index(asked["host"]), *asked["args"])
            done = {"started": started, "at": time.time()}
        except Exception as exc:  # noqa: BLE001 - the asking process gets it
            done = {"error": f"{type(exc).__name__}: {exc}"}
        _write_json(os.path.join(self.directory, name + ".done"), done)

    def close(self):
        self._stop.set()
        self._thread.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


_RECEIVER = """
import socket, sys, time
server = socket.create_server((sys.argv[1], 0))
print(server.getsockname()[1], flush=True)
conn, _ = server.accept()
total, started = 0, None
while True:
    chunk = conn.recv(1 << 20)
    if not chunk:
        break
    started = started or time.monotonic()
    total += len(chunk)
print(total, time.monotonic() - started, flush=True)
"""
_SENDER = """
import socket, sys
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10) as conn:
    block, left = bytes(1 << 20), int(sys.argv[3])
    while left > 0:
        conn.sendall(block[:left])
        left -= len(block)
"""


def transfer_rate(cluster, sender, receiver, nbytes):
    """Bits per second of one TCP stream of ``nbytes`` from host ``sender`` to host ``receiver``, timed
    by the receiver from its first byte to the end."""
    server = cluster.popen(receiver, [sys.executable, "-c", _RECEIVER, cluster.host_address(receiver)],
                           stdout=subprocess.PIPE, text=True)
    try:
        port = server.stdout.readline().strip()
        subprocess.run(["ip", "netns", "exec", cluster.namespace(sender), sys.executable, "-c", _SENDER,
                        cluster.host_address(receiver), port, str(nbytes)], check=True, timeout=120)
        total, seconds = server.stdout.readline().split()
        server.wait(10)
    finally:
        server.kill()
        server.wait()
    return int(total) * 8 / float(seconds)


def _hold(hosts, spark):
    """Make a cluster, print its run id and addresses, and wait to be killed (tests of the cleanup)."""
    with HostsCluster(hosts=hosts, spark=spark) as cluster:
        sleeper = cluster.popen(0, ["sleep", "3600"])
        print(json.dumps({"run_id": cluster.run_id, "dir": cluster.dir, "url": cluster.url,
                          "sleeper": sleeper.pid, "hosts": [cluster.host_address(i) for i in range(hosts)]}),
              flush=True)
        time.sleep(3600)


def main(argv):
    """``sweep``: remove leftovers of interrupted runs. ``hold HOSTS [spark]``: see _hold."""
    if argv[:1] == ["sweep"]:
        print("removed runs:", " ".join(sweep()) or "none")
    elif argv[:1] == ["hold"]:
        _hold(int(argv[1]), spark=argv[2:3] == ["spark"])
    else:
        sys.exit("usage: python -m support.hosts sweep | hold HOSTS [spark]")


if __name__ == "__main__":
    main(sys.argv[1:])
