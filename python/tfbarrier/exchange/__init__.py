"""How a fit's workers exchange gradients: an Exchange, chosen once per fit (``choose``), answers everything
that differs between the ways they can travel, on the driver, in the task and in the training process.

Two are registered (EXCHANGES):

- ``"tfbarrier"`` (authenticated_ring.py, ring_side.py): tfbarrier's own ring (ring.py), which admits only the job's
  processes, over TLS where the cluster encrypts; no TensorFlow server. Every fit of at most one GPU per
  worker by default.
- ``"strategy"`` (strategy.py, strategy_side.py): MultiWorkerMirroredStrategy's collectives through TensorFlow's gRPC server
  (its own options: ``communication={"implementation": "ring" | "nccl" | "auto"}``), which accepts any
  client and is never encrypted; the default for workers of several GPUs each on a trusted network.

A variant of an exchange is a subclass and a line in EXCHANGES; a new way for gradients to travel adds its
side in a training process (a ``WorkerSide``, base.py, whose hooks fitting/training_loop.py calls).
ARCHITECTURE.md, "Where a new thing goes", counts the places.
"""

import warnings

from tfbarrier import checks
from tfbarrier.errors import InvalidArgumentError
from tfbarrier.exchange.authenticated_ring import AuthenticatedRing
from tfbarrier.exchange.base import COMPRESSIONS, SHARDS, Exchange
from tfbarrier.exchange.strategy import IMPLEMENTATIONS, StrategyExchange

AUTO = "auto"
EXCHANGES = {exchange.name: exchange for exchange in (AuthenticatedRing(), StrategyExchange())}  # the registrations
# communication's implementation before exchange= said which exchange: the ring's old name, and the strategy's
OLD_RING_SPELLING, STRATEGY_IMPLEMENTATIONS = "tfbarrier", ("ring", "nccl")

__all__ = ["AUTO", "EXCHANGES", "Exchange", "GpuExchangeWarning", "check_communication", "choose", "named", "requested"]


class GpuExchangeWarning(UserWarning):
    """A GPU fit's gradients travel over tfbarrier's ring: each step copies them to the host and back."""


COMMUNICATION_KEYS = {"bytes_per_pack": "a non-negative int (0: every gradient in one pack)",
                      "timeout_seconds": "seconds, > 0", "compression": " or ".join(map(repr, COMPRESSIONS)),
                      "implementation": "the strategy's 'auto', 'ring' or 'nccl'",
                      "shard": "the ring's 'none' or 'optimizer' (each worker holds 1/N of the optimizer's state)"}


def check_communication(options):
    """fit's ``communication``: the exchanges' options, each value checked here; which ones the chosen exchange
    takes, it checks itself (``Exchange.check_options``). ``implementation`` may still be the ring's old spelling
    ("tfbarrier"), which ``requested`` turns into ``exchange=``."""
    if options is None:
        return None
    if not isinstance(options, dict) or set(options) - set(COMMUNICATION_KEYS):
        takes = "; ".join(f"{k}: {v}" for k, v in COMMUNICATION_KEYS.items())
        raise InvalidArgumentError(f"communication must be a dict of the exchange's options ({takes}), got {options!r}")
    options = dict(options)
    if "bytes_per_pack" in options:
        options["bytes_per_pack"] = checks.non_negative_int("communication['bytes_per_pack']", options["bytes_per_pack"])
    if "timeout_seconds" in options:
        options["timeout_seconds"] = checks.positive_seconds("communication['timeout_seconds']", options["timeout_seconds"])
    if options.get("implementation", "auto") not in (*IMPLEMENTATIONS, OLD_RING_SPELLING):
        raise InvalidArgumentError(f"communication['implementation'] must be {COMMUNICATION_KEYS['implementation']}, "
                                   f"got {options['implementation']!r}")
    if options.get("compression", "none") not in COMPRESSIONS:
        raise InvalidArgumentError(f"communication['compression'] must be {COMMUNICATION_KEYS['compression']} "
                                   f"(gradients all-reduced in float16), got {options['compression']!r}")
    if options.get("shard", "none") not in SHARDS:
        raise InvalidArgumentError(f"communication['shard'] must be {' or '.join(map(repr, SHARDS))} (each worker holds "
                                   f"the optimizer's state of 1/N of the weights), got {options['shard']!r}")
    return options


def named(name):
    """The registered exchange called ``name``."""
    if name not in EXCHANGES:
        raise InvalidArgumentError(f"exchange must be one of {[AUTO, *EXCHANGES]}, got {name!r}")
    return EXCHANGES[name]


def requested(exchange, communication):
    """(the exchange a fit asks for, its ``communication`` options) from fit's arguments. The spellings from
    before ``exchange=`` still work, for one release, with a FutureWarning naming the new one:
    ``communication={"implementation": "tfbarrier"}`` is ``exchange="tfbarrier"``, and ``{"implementation":
    "ring"}`` (or "nccl") alone is ``exchange="strategy"`` with that implementation (MultiWorkerMirroredStrategy's
    collective through TensorFlow's open gRPC server, not tfbarrier's ring)."""
    communication = dict(communication or {})
    implementation = communication.get("implementation")
    if exchange not in (AUTO, *EXCHANGES):
        named(exchange)
    if implementation == OLD_RING_SPELLING:
        communication.pop("implementation")
        _warn("communication={'implementation': 'tfbarrier'}", "exchange='tfbarrier'")
        if exchange == AUTO:
            exchange = "tfbarrier"
    elif implementation in STRATEGY_IMPLEMENTATIONS and exchange == AUTO:
        _warn(f"communication={{'implementation': '{implementation}'}} alone",
              f"exchange='strategy', communication={{'implementation': '{implementation}'}} (it is "
              "MultiWorkerMirroredStrategy's collective, through TensorFlow's gRPC server that accepts any "
              "client; tfbarrier's authenticated ring is exchange='tfbarrier', the default)")
        exchange = "strategy"
    elif implementation == AUTO and exchange == AUTO:
        communication.pop("implementation")  # what "auto" meant before exchange= existed: the default
    return exchange, communication


def _warn(old, new):
    warnings.warn(f"{old} is deprecated and will be removed in the next release: use {new}", FutureWarning,
                  stacklevel=4)


def choose(exchange, communication, *, native, encrypted, gpus_per_worker):
    """The exchange of a fit, chosen once: ``exchange`` ("auto" or a name, from ``requested``); "auto" is
    tfbarrier's ring, except for workers of several GPUs each on a cluster that does not encrypt (the
    strategy's local replicas). A Keras 3 model that trains natively has only the ring. Its options and
    the workers' GPUs are checked against it."""
    if exchange == AUTO:
        exchange = "strategy" if gpus_per_worker > 1 and not encrypted and not native else "tfbarrier"
    chosen = named(exchange)
    if native and chosen.tensorflow_server:
        raise InvalidArgumentError(
            "a Keras 3 model that trains natively (a custom layer, a subclassed model) trains over tfbarrier's "
            f"ring only: drop exchange='{exchange}'")
    chosen.check_options(communication)
    chosen.check_gpus(gpus_per_worker)
    if gpus_per_worker and not chosen.tensorflow_server:
        warnings.warn(
            f"each worker trains on a GPU, and exchange='{chosen.name}' copies every gradient to the host and back "
            "at each step and sums it there (docs/guides/speed.md, \"GPUs\": about 1.2x NCCL's exchange across hosts on 10 "
            "Gbit/s, much more between GPUs of one host); on a network you trust, pass exchange='strategy', "
            "communication={'implementation': 'nccl'} to sum on the devices", GpuExchangeWarning, stacklevel=4)
    return chosen
