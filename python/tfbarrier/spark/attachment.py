"""Attach this Python process to a Spark driver JVM that another program started and runs: sparklyr's
(what R's face uses), a notebook server's, a JVM-side application's.

The other program starts Spark's own ``org.apache.spark.api.python.Py4JServer`` in its driver JVM (a
py4j server on the loopback, guarded by a secret) and hands this process its port and secret, as
Apache Zeppelin's and Apache Livy's Python interpreters are handed theirs. ``attach`` connects to it and
wraps the JVM's running SparkContext and default SparkSession in pyspark's classes: jobs then run in
that application, on its executors, and its temporary views are this session's.

The secret is a parameter only: it never enters this process's environment (which Spark's Python
workers and training processes would inherit), a log line or an error message. The attached context
cannot stop the JVM's SparkContext: ``stop()`` on it (or on its session) only detaches.
"""

import os
import secrets
import subprocess
import sys
import sysconfig
import threading

from tfbarrier.errors import ClusterError, InvalidArgumentError
from tfbarrier.spark import cluster

# What pyspark's own launch_gateway imports into the JVM view, by pyspark's major version (pyspark
# reads some classes by these short names).
_COMMON_IMPORTS = ("org.apache.spark.SparkConf", "org.apache.spark.api.java.*", "org.apache.spark.api.python.*",
                   "org.apache.spark.ml.python.*", "org.apache.spark.mllib.api.python.*",
                   "org.apache.spark.resource.*", "org.apache.spark.sql.api.python.*", "org.apache.spark.sql.hive.*",
                   "scala.Tuple2")
_SQL_IMPORTS = {3: ("org.apache.spark.sql.*",),
                4: ("org.apache.spark.sql.Encoders", "org.apache.spark.sql.OnSuccessCall",
                    "org.apache.spark.sql.functions", "org.apache.spark.sql.classic.*")}

_attached = {}  # the attachment of this process: gateway, port, context, session


def _pyspark_version():
    import pyspark

    return pyspark.__version__


def _major_minor(version):
    return tuple(int(part) for part in version.split(".")[:2])


def check_versions(jvm_version, pyspark_version):
    """Refuse a pyspark whose major.minor differs from the JVM's Spark: Python workers and the JVM
    speak the release's own protocol."""
    if _major_minor(jvm_version) != _major_minor(pyspark_version):
        wanted = ".".join(jvm_version.split(".")[:2])
        raise ClusterError(
            f"the Spark driver JVM runs Spark {jvm_version}, but this Python ({sys.executable}) has pyspark "
            f"{pyspark_version}: they must be the same release. Install pyspark {wanted} there "
            f"(pip install 'pyspark=={wanted}.*', or in R install_tfbarrier(spark_version = \"{wanted}\")), "
            "or connect to a Spark of this pyspark's version")


def _gateway(port, secret, pin_thread):
    """A py4j client of the JVM's Py4JServer: a ClientServer when the JVM pins threads (Spark's default,
    PYSPARK_PIN_THREAD=true), else a JavaGateway, with pyspark's own imports."""
    from py4j.clientserver import ClientServer, JavaParameters, PythonParameters
    from py4j.java_gateway import GatewayParameters, JavaGateway, java_import

    if pin_thread:
        gateway = ClientServer(java_parameters=JavaParameters(port=port, auth_token=secret, auto_convert=True),
                               python_parameters=PythonParameters(port=0, eager_load=False))
    else:
        gateway = JavaGateway(gateway_parameters=GatewayParameters(port=port, auth_token=secret, auto_convert=True))
    gateway.proc = None  # pyspark reads it: no JVM process of ours
    for name in _COMMON_IMPORTS + _SQL_IMPORTS.get(_major_minor(_pyspark_version())[0], _SQL_IMPORTS[4]):
        java_import(gateway.jvm, name)
    return gateway


def _running_session(gateway, port):
    """The JVM's default SparkSession, whose SparkContext runs (never one made here: a JVM without one is
    refused)."""
    from py4j.protocol import Py4JError, Py4JNetworkError

    try:
        default = gateway.jvm.org.apache.spark.sql.SparkSession.getDefaultSession()
    except Py4JNetworkError as exc:
        raise ClusterError(
            f"could not reach a Spark driver JVM's Py4J server on 127.0.0.1:{port} ({type(exc).__name__}): "
            "attaching needs this process on the driver's own machine (a Livy or other remote connection cannot "
            "be attached: use its own Python session, or Spark Connect), the server's port and its secret") from None
    except Py4JError as exc:  # the server answered, but refused the secret or the call
        raise ClusterError(f"the Py4J server on 127.0.0.1:{port} refused this process ({type(exc).__name__}): "
                           "check its port and secret") from None
    if not default.isDefined() or default.get().sparkContext().isStopped():
        raise ClusterError("the JVM behind the Py4J server has no running SparkSession: start Spark there first")
    return default.get()


class _Attached:
    """Mixed into pyspark's SparkContext and SparkSession: stopping either detaches this process and
    leaves the JVM's SparkContext (and its default session) running, since another program owns them."""

    def stop(self):
        detach()


def _attached_classes():
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    return (type("AttachedSparkContext", (_Attached, SparkContext), {}),
            type("AttachedSparkSession", (_Attached, SparkSession), {}))


def _executor_python(conf, master, python):
    """The interpreter Spark's Python workers run for this process's jobs: ``python``, else the
    connection's spark.pyspark.python or spark.executorEnv.PYSPARK_PYTHON, else PYSPARK_PYTHON, else in
    local mode this interpreter; on a cluster, without any of them, a ClusterError."""
    chosen = (python or conf.get("spark.pyspark.python", None)
              or conf.get("spark.executorEnv.PYSPARK_PYTHON", None) or os.environ.get("PYSPARK_PYTHON"))
    if chosen:
        return chosen
    if cluster.is_local_master(master):
        return sys.executable
    raise ClusterError(
        f"the Spark application (master {master}) does not say which Python its executors run, so its Python "
        "workers would start a bare python3 without tfbarrier: connect with spark.pyspark.python set to an "
        "interpreter that has tfbarrier on every executor host (in R: spark_connect(config = "
        "tf_spark_config(python = ...))), or pass python= to attach()")


def _library_dir(python):
    """The directory of ``python``'s own libpython, or None for an interpreter without one (linked
    statically) or that cannot be asked."""
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        shared, libdir = sysconfig.get_config_var("Py_ENABLE_SHARED"), sysconfig.get_config_var("LIBDIR")
    else:  # asked without the library path that may shadow its libpython
        code = "import sysconfig as s; print(s.get_config_var('Py_ENABLE_SHARED'), s.get_config_var('LIBDIR'))"
        env = {key: value for key, value in os.environ.items() if key != "LD_LIBRARY_PATH"}
        try:
            shared, libdir = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60,
                                            env=env, check=True).stdout.split(maxsplit=1)
        except (OSError, ValueError, subprocess.SubprocessError):
            return None
        shared, libdir = int(shared), libdir.strip()
    return libdir if shared and libdir else None


def _own_libpython_first(context, jvm):
    """Put the executors' interpreter's own library directory first on its Python workers' library path
    when the JVM starts them on this machine. They inherit the JVM's LD_LIBRARY_PATH, and a JVM that R
    started (sparklyr's) has R's, which names the system's library directory first: a Debian libpython
    of the same soname there shadows a venv's own (3.11.2 loaded by a 3.11.7, which then fails to import
    ``_ssl``). Spark sets ``context.environment`` in every Python worker of this process's jobs."""
    if not cluster.on_this_machine(context.master):
        return  # a cluster's workers inherit their executor's environment, not this JVM's
    inherited = context.environment.get("LD_LIBRARY_PATH") or jvm.java.lang.System.getenv("LD_LIBRARY_PATH")
    libdir = _library_dir(context.pythonExec) if inherited else None
    if libdir:
        context.environment["LD_LIBRARY_PATH"] = os.pathsep.join((libdir, inherited))


def _build(gateway, jvm_session, python, embedded):
    from pyspark import SparkConf

    context_class, session_class = _attached_classes()
    jvm_context = jvm_session.sparkContext()
    jsc = gateway.jvm.org.apache.spark.api.java.JavaSparkContext(jvm_context)
    conf = SparkConf(_jconf=jvm_context.getConf())  # a copy: pyspark's defaults do not reach the JVM's
    context = context_class(gateway=gateway, jsc=jsc, conf=conf)
    context.pythonExec = _executor_python(context.getConf(), context.master, python)
    _own_libpython_first(context, gateway.jvm)
    if embedded:
        _attached["accumulator_server"] = _accumulators_in_process(context)
    return session_class(context, jsparkSession=jvm_session)  # the other program's views are its views


# A process of its own answering the JVM's accumulator updates, with pyspark's own server: it reads its
# secret on stdin, prints its port, and exits when stdin closes (its parent is gone or detached). Its
# stderr is dropped: pyspark's server prints a traceback each time the JVM closes its connection.
_ACCUMULATOR_SERVER = """
import sys
from pyspark import accumulators
secret = sys.stdin.readline().strip()
try:
    server = accumulators._start_update_server(secret, False)
except TypeError:  # pyspark 3.5: no Unix socket parameters
    server = accumulators._start_update_server(secret)
print(server.server_address[1], flush=True)
sys.stdin.read()
"""


def _accumulators_in_process(context):
    """Point the JVM's Python accumulator at a server in a process of its own. The driver's JVM reports
    every Python task's end to that server and waits for its answer, from its scheduler's one thread;
    R runs Python's threads only while it calls into Python, so an R session busy elsewhere (collecting
    through sparklyr) would hold every job there. Python accumulators are not summed on such a session."""
    secret = secrets.token_hex(32)
    server = subprocess.Popen([sys.executable, "-c", _ACCUMULATOR_SERVER], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=dict(os.environ))
    server.stdin.write(secret + "\n")
    server.stdin.flush()
    port = int(server.stdout.readline())
    context._javaAccumulator = context._jvm.PythonAccumulatorV2("localhost", port, secret)
    context._jsc.sc().register(context._javaAccumulator)
    return server


def _in_helper_thread(function, *args):
    """Run ``function`` in a thread of its own: pyspark's SparkContext takes over SIGINT when made on the
    main thread, which in R (reticulate) would leave R's own Ctrl-C dead."""
    outcome = {}

    def target():
        try:
            outcome["value"] = function(*args)
        except BaseException as exc:  # noqa: B902 - handed to the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=target, name="tfbarrier-attach")
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def attach(port, secret, *, pin_thread=True, python=None, embedded=False):
    """Attach to the Spark driver JVM whose ``org.apache.spark.api.python.Py4JServer`` listens on the
    loopback at ``port`` with ``secret``, and return a pyspark SparkSession of its running application
    (its default session: the other program's temporary views are visible, and yours to it).

    The JVM's Spark must be of this pyspark's release (major.minor), else a ClusterError naming both.
    Attaching again to the same live server returns the same session; a process attached to a JVM that
    is gone detaches first. ``detach()`` (or ``stop()`` on the session) leaves the JVM's SparkContext
    running.

    Parameters
    ----------
    port : int
        The server's port (``Py4JServer.getListeningPort``).
    secret : str
        The server's secret (``Py4JServer.secret``). Never logged, never put in the environment.
    pin_thread : bool
        Whether the JVM runs with PYSPARK_PIN_THREAD=true (Spark's default): a py4j ClientServer.
    python : str, optional
        The interpreter Spark's Python workers run for this process's jobs. Default: the application's
        spark.pyspark.python (or spark.executorEnv.PYSPARK_PYTHON, or PYSPARK_PYTHON); in local mode,
        this interpreter.
    embedded : bool
        True when this Python is embedded in a program that runs its threads only while it calls into
        Python (R's reticulate): the JVM's accumulator updates are then answered by a process of its own
        (a JVM waiting on a thread that does not run would hold every job), and Python accumulators are
        not available on the session.
    """
    port = int(port)
    if not isinstance(secret, str) or not secret:
        raise InvalidArgumentError("secret must be the Py4J server's secret, a non-empty string")
    if _attached:
        if _attached["port"] == port and cluster.context_alive(_attached["session"]):
            return _attached["session"]
        detach()
    _refuse_own_context()
    gateway = _gateway(port, secret, pin_thread)
    try:
        jvm_session = _running_session(gateway, port)
        check_versions(jvm_session.version(), _pyspark_version())
        session = _in_helper_thread(_build, gateway, jvm_session, python, embedded)
    except BaseException:
        _forget_pyspark_state()
        _stop_accumulator_server()
        gateway.close()
        raise
    _attached.update(gateway=gateway, port=port, session=session)
    return session


def _refuse_own_context():
    from pyspark import SparkContext

    own = SparkContext._active_spark_context
    if own is not None and getattr(own, "_jsc", None) is not None:
        raise ClusterError(
            "this Python process already runs a SparkContext of its own (master "
            f"{own.master}): stop it first (spark.stop()), since one process holds one SparkContext")


def attached_session():
    """The session of the attachment, or None when this process is not attached."""
    return _attached.get("session")


def is_attached(spark):
    """True for a session of a JVM this process attached to: another program computes its frames, maybe
    when this process is not running Python (R, busy in sparklyr) or is gone."""
    return isinstance(spark, _Attached)


def _forget_pyspark_state():
    """pyspark's process-wide references to the attached context and session, dropped without calling
    into the JVM (it may be gone)."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession, SQLContext

    with SparkContext._lock:
        context = SparkContext._active_spark_context
        if context is not None and getattr(context, "_accumulatorServer", None):
            context._accumulatorServer.shutdown()
            context._accumulatorServer = None
        if context is not None:
            context._jsc = None
        SparkContext._active_spark_context = None
        SparkContext._gateway = None
        SparkContext._jvm = None
    SparkSession._instantiatedSession = None
    SparkSession._activeSession = None
    SQLContext._instantiatedContext = None


def detach():
    """Drop this process's attachment: pyspark's references to the JVM's context and session, and the
    connection to its Py4J server. The JVM's SparkContext runs on; the server is its owner's to shut
    down. Nothing happens when this process is not attached."""
    if not _attached:
        return
    gateway = _attached["gateway"]
    _forget_pyspark_state()
    _stop_accumulator_server()
    _attached.clear()
    gateway.close()


def _stop_accumulator_server():
    server = _attached.pop("accumulator_server", None)
    if server is not None:
        server.stdin.close()
        server.wait(10)
