"""The user's own code, pickled for the training processes: cloudpickle, with the modules of the user's scripts,
test files and notebook helpers (which no executor can import) shipped by value."""

import os
import sys
import sysconfig

import cloudpickle


def _installed(module):
    """True for modules of the standard library or of an installed distribution (importable on any
    executor that has the same environment); False for the user's own scripts and notebooks."""
    path = getattr(module, "__file__", None)
    if path is None:
        return module.__name__ in sys.builtin_module_names
    path = os.path.realpath(path)
    roots = {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    return any(path.startswith(os.path.realpath(root) + os.sep) for root in roots)


def _registered_by_value(module):
    return module.__name__ in getattr(cloudpickle.cloudpickle, "_PICKLE_BY_VALUE_MODULES", ())


def pickle_user_code(obj, *functions):
    """cloudpickle ``obj``, shipping the modules of ``functions`` (functions or classes) by value when
    they are the user's own code (a script, a test module, a notebook helper), which the training
    processes could not import. The user's other modules that ``obj`` uses go by value once registered
    with cloudpickle's ``register_pickle_by_value`` (docs/guides/training.md, "Your code on the workers"); such a registration outlives the call."""
    modules = {sys.modules.get(getattr(function, "__module__", None) or "") for function in functions}
    by_value = [module for module in modules if module is not None and module.__name__ != "__main__"
                and not _installed(module) and not _registered_by_value(module)]
    for module in by_value:
        cloudpickle.register_pickle_by_value(module)
    try:
        return cloudpickle.dumps(obj)
    finally:
        for module in by_value:
            cloudpickle.unregister_pickle_by_value(module)
