"""An impostor host (test_hosts): on a host whose Python path starts here, every Python process imports
this at start-up, and a training process of it joins its ring with a secret other than its job's while
the file named by $TFBARRIER_TEST_IMPOSTOR exists: its peers cannot authenticate it, nor it them."""

import importlib.abc
import importlib.machinery
import os
import sys

MARKER_ENV = "TFBARRIER_TEST_IMPOSTOR"


class _Impostor(importlib.abc.MetaPathFinder):
    """Finds tfbarrier.exchange.ring as usual, then replaces its Ring.join by one that alters the secret."""

    def find_spec(self, name, path, target=None):
        if name != "tfbarrier.exchange.ring":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            join = module.Ring.join.__func__

            def join_as_impostor(cls, rank, addresses, secret, *args, **kwargs):
                if os.path.exists(os.environ.get(MARKER_ENV, "")):
                    secret = b"not " + secret
                return join(cls, rank, addresses, secret, *args, **kwargs)

            module.Ring.join = classmethod(join_as_impostor)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Impostor())
