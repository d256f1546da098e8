# tfbarrier: `make demo` installs everything and trains the MNIST demo; `make test` runs every test.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
CONSTRAINTS := -c requirements/constraints.txt
STAMP := $(VENV)/.installed

export SPARK_LOCAL_IP ?= 127.0.0.1
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: demo test test-python bench venv system-deps clean

demo: venv
	$(PY) examples/mnist_demo.py

test: test-python

test-python: venv
	$(PY) -m pytest tests/python

bench: venv
	$(PY) bench/predict_bench.py

venv: system-deps $(STAMP)

# Java for Spark; everything else comes from PyPI into .venv.
system-deps:
	@command -v java >/dev/null 2>&1 || { \
	  echo "installing Java 17 for Spark (apt-get)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless; }

# tf-keras declares a dependency on the full `tensorflow` wheel (+600 MB next to tensorflow-cpu):
# it is installed with --no-deps, after tensorflow-cpu.
$(STAMP): pyproject.toml requirements/constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(CONSTRAINTS) -e ".[dev]" "tensorflow-cpu==2.21.*"
	$(PIP) install -q $(CONSTRAINTS) --no-deps "tf-keras==2.21.*"
	$(PY) -c "import numpy, pyarrow, pyspark, tensorflow, tf_keras; assert numpy.__version__ < '2'"
	touch $@

clean:
	rm -rf $(VENV) *.egg-info python/*.egg-info .pytest_cache
