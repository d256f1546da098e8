"""A bench-only exchange (issue 59, item 4): tfbarrier's ring with its gradient packs sent first layers first,
the order before issue 59, so that hosts_bench can set it beside today's (last layers first) in one run.

It is ARCHITECTURE.md's worked example of a variant of an exchange: a subclass that changes what the exchange
answers (here ``last_layers_first``) and one registration (``register``, on the driver). The job carries the
exchange to the training processes, whose Python imports this module from bench/, first on Spark's workers'
PYTHONPATH (fit_bench).
"""

from tfbarrier import exchange
from tfbarrier.exchange.authenticated_ring import AuthenticatedRing

NAME = "first-layers-first"


class FirstLayersFirst(AuthenticatedRing):
    name = NAME
    last_layers_first = False


def register():
    """Make ``fit(exchange="first-layers-first")`` this exchange (on the driver)."""
    exchange.EXCHANGES[NAME] = FirstLayersFirst()
