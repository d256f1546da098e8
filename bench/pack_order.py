"""A bench-only exchange (issue 59, item 4): tfbarrier's ring with its gradient packs sent first layers first,
the order before issue 59, so that hosts_bench can set it beside today's (last layers first) in one run.

It is what ARCHITECTURE.md's worked example of a new exchange says: one module (an Exchange subclass whose
``trainer`` is this module, its ``train`` the ring's with one argument changed) and one registration
(``register``, on the driver). Spark's workers import it from bench/, first on their PYTHONPATH (fit_bench).
"""

import functools

from tfbarrier import exchange
from tfbarrier.exchange.authenticated_ring import AuthenticatedRing

NAME = "first-layers-first"


class FirstLayersFirst(AuthenticatedRing):
    name = NAME
    trainer = __name__


def train(job, config, channel):
    """The ring's training process, its packs leaving in the old order."""
    from tfbarrier.exchange import ring_hooks
    from tfbarrier.fitting import ring_training

    ring_training.exchange_gradients = functools.partial(ring_hooks.exchange_gradients, last_layers_first=False)
    return ring_training.train(job, config, channel)


def register():
    """Make ``fit(exchange="first-layers-first")`` this exchange (on the driver)."""
    exchange.EXCHANGES[NAME] = FirstLayersFirst()
