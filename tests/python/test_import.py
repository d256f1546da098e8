"""Importing tfbarrier must stay cheap: no TensorFlow (executors and R sessions pay for it only in
the training processes)."""

import subprocess
import sys


def test_import_does_not_import_tensorflow_or_keras():
    code = "import sys, tfbarrier; print(sorted(m for m in ('tensorflow', 'keras', 'tf_keras') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
