"""Importing tfbarrier must stay cheap: no TensorFlow (executors and R sessions pay for it only in
the training processes)."""

import os
import subprocess
import sys

import pytest


def test_import_does_not_import_tensorflow_or_keras():
    code = "import sys, tfbarrier; print(sorted(m for m in ('tensorflow', 'keras', 'tf_keras') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_training_process_starts_on_light_modules_and_the_calls_load_on_first_use():
    code = ("import sys, tfbarrier.spark.training_process, tfbarrier.spark.spares, tfbarrier.spark.keeper\n"
            "heavy = sorted(m for m in ('numpy', 'pyarrow', 'pandas', 'pyspark', 'tfbarrier.api') if m in sys.modules)\n"
            "import tfbarrier, tfbarrier.api\n"
            "from tfbarrier import predict\n"
            "print(heavy, tfbarrier.fit is tfbarrier.api.fit, predict is sys.modules['tfbarrier.predicting.inference'].predict,\n"
            "      tfbarrier.frames.__name__, hasattr(tfbarrier, 'no_such_thing'), 'tune' in dir(tfbarrier))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[] True True tfbarrier.frames False True"


def _import_stderr(code, **env):
    environ = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    environ.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env=environ).stderr


BANNERS = ("absl::InitializeLog", "oneDNN custom operations", "cpu_feature_guard")


# TensorFlow turns oneDNN on only on some CPUs (those with AVX-512, among others), and prints its banner
# only then: both modes are tested on any CPU, TF_ENABLE_ONEDNN_OPTS=0 standing in for a CPU without it.
@pytest.mark.parametrize("onednn", ["default", "0"])
def test_tensorflows_start_up_banners_stay_off_the_console_after_import_tfbarrier(onednn):
    env = {} if onednn == "default" else {"TF_ENABLE_ONEDNN_OPTS": onednn}
    shown = _import_stderr("import tensorflow", **env)
    printed = [banner for banner in BANNERS if banner in shown]  # what TensorFlow prints on its own here
    assert "absl::InitializeLog" in printed, shown
    quiet = _import_stderr("import tfbarrier, keras, sys; sys.stderr.write('kept\\n')", **env)
    assert not any(banner in quiet for banner in BANNERS), quiet
    assert quiet.strip().splitlines()[-1] == "kept"
    # Asking TensorFlow for its INFO logs keeps them.
    asked = _import_stderr("import tfbarrier, tensorflow", TF_CPP_MIN_LOG_LEVEL="0", **env)
    assert all(banner in asked for banner in printed), asked


def test_what_tensorflows_import_writes_besides_the_banners_is_kept():
    code = ("import os, tfbarrier, tfbarrier.tf_banners as b\n"
            "with b.banners_filtered():\n"
            "    os.write(2, b'WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\\n')\n"
            "    os.write(2, b'I0000 00:00:1795369571.873013   12925 port.cc:153] oneDNN custom operations are on.\\n')\n"
            "    os.write(2, b'E0000 00:00:1795369571.873013   12925 gpu.cc:12] a real error\\n')\n")
    assert _import_stderr(code).splitlines() == ["E0000 00:00:1795369571.873013   12925 gpu.cc:12] a real error"]


def test_the_calls_stay_calls_whatever_was_imported_first():
    """Importing a submodule sets the package's attribute of its name: a call of the same name as a module
    (``tfbarrier.attach`` was both) became the module once anything imported it (issue 57: R's
    ``core$attached_session()`` then ``core$attach(...)`` failed with "attempt to apply non-function")."""
    code = ("import importlib, pkgutil, types, tfbarrier\n"
            "tfbarrier.attached_session()\n"
            "attach_after_session = callable(tfbarrier.attach)\n"
            "for module in pkgutil.walk_packages(tfbarrier.__path__, 'tfbarrier.'):\n"
            "    if not module.name.endswith(('__main__', 'r_closure')):\n"
            "        importlib.import_module(module.name)\n"
            "modules = sorted(name for name in tfbarrier.__all__ if name != 'errors'\n"
            "                 and isinstance(getattr(tfbarrier, name), types.ModuleType))\n"
            "print(attach_after_session, modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "True []", out.stderr[-3000:]
