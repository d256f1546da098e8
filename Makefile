# tfbarrier: `make demo` installs everything (the Python venv, R and the R package) and runs the Python
# and R demos; `make test` runs every test; `make docs` builds the documentation site into site/;
# `make dist` the wheel, the sdist and the R source package into dist/.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
CONSTRAINTS := -c requirements/constraints.txt
STAMP := $(VENV)/.installed

R_VERSION := $(shell sed -n 's/^Version: //p' DESCRIPTION)
R_TARBALL := build/tfbarrier_$(R_VERSION).tar.gz
# R from Debian (no CRAN here): reticulate 1.28, testthat, knitr + markdown for the vignette.
R_DEBS := r-base-core r-base-dev r-cran-reticulate r-cran-testthat r-cran-jsonlite r-cran-knitr \
          r-cran-markdown r-cran-roxygen2 qpdf
# rpy2 on R 4.2: newer rpy2-rinterface needs R 4.5 symbols; these build from source against r-base-dev.
RPY2 := "rpy2==3.6.6" "rpy2-rinterface==3.6.5"
RPY2_STAMP := $(VENV)/.rpy2

export SPARK_LOCAL_IP ?= 127.0.0.1
export TF_CPP_MIN_LOG_LEVEL ?= 2
export TFBARRIER_PYTHON := $(abspath $(PY))
# Where the R tests find the guides, which the R package does not carry (tests/testthat/test-docs.R).
export TFBARRIER_SOURCE_DIR := $(CURDIR)
# Spark releases the core is tested on besides .venv's (test-spark-versions); their Pythons, and .venv's,
# for the tests that attach one release's pyspark to another's JVM.
SPARK_VERSIONS := 3.5 4.0
VERSION_VENVS := $(foreach v,$(SPARK_VERSIONS),build/venv-spark$(v)/.installed)
VERSION_TESTS := $(foreach v,$(SPARK_VERSIONS),test-spark-$(v))
export TFBARRIER_SPARK_PYTHONS := $(abspath $(PY)) $(foreach v,$(SPARK_VERSIONS),$(abspath build/venv-spark$(v)/bin/python))

.PHONY: demo demo-python demo-r test test-start test-others test-leftovers test-python test-spark-versions $(VERSION_TESTS) test-r \
        test-docs docs docs-deps dist r-build r-install r-deps venv system-deps clean

demo: demo-python demo-r

demo-python: venv
	$(PY) examples/mnist_demo.py

# The R package's own demo (inst/examples), with the R package installed as a user would have it.
demo-r: r-install
	Rscript inst/examples/digits_cnn.R

# The suite starts and ends with a look at the temporary directory: it must leave no tfbarrier directory
# there (tests/leftovers.py: counted before it sweeps as the next start on a host would).
# The Python suite runs alone (its two workers keep both cores busy); then the rest at once, each log printed
# whole when it ends: the core subset on each older Spark release, R CMD build and check, and the docs, each of
# which leaves much of a core idle (JVMs and R starting, one-threaded builds).
test: test-start test-python test-others test-leftovers

test-others: $(VERSION_VENVS) venv
	@$(MAKE) --no-print-directory -j4 --output-sync=target $(VERSION_TESTS) test-r test-docs

test-start: venv
	@$(PY) tests/leftovers.py start

test-leftovers: venv
	@$(PY) tests/leftovers.py check

# Two pytest-xdist workers, a test file each at a time (module fixtures share their clusters): much of a
# test's time is a JVM or TensorFlow starting, or a fault's timeout running out, which the other fills.
test-python: venv $(VERSION_VENVS)
	$(PY) -m pytest -n 2 --dist loadfile $(DOCS_TESTS:%=--ignore=%) tests/python

# The core subset (tests marked `versions`: the default fit over the ring, a native Keras 3 fit, a fit under
# TLS, named inputs, predict, tune, a failure, attach) on each older Spark
# release the core supports, each in a venv of its own: that release's pyspark, then .venv's packages
# (TensorFlow and the rest) through a .pth line, so only pyspark is installed again. The releases run at
# once, each log printed whole when it ends: a run leaves a fifth of the 2 cores idle (JVMs starting).
test-spark-versions: $(VERSION_VENVS)
	@$(MAKE) --no-print-directory -j2 --output-sync=target $(VERSION_TESTS)

$(VERSION_TESTS): test-spark-%: build/venv-spark%/.installed
	@echo "== the core subset on pyspark $*"
	build/venv-spark$*/bin/python -m pytest -q -m versions -p no:cacheprovider tests/python

build/venv-spark%/.installed: $(STAMP)
	rm -rf build/venv-spark$* && $(PYTHON) -m venv build/venv-spark$*
	build/venv-spark$*/bin/pip install -q --disable-pip-version-check --no-deps "pyspark==$*.*"
	echo "import site; site.addsitedir('$(shell $(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')')" \
	  > "$$(build/venv-spark$*/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_tfbarrier_venv.pth"
	build/venv-spark$*/bin/python -c "import pyspark, tfbarrier, tensorflow; assert pyspark.__version__.startswith('$*.')"
	touch $@

# R CMD check runs tests/testthat (real Spark and TensorFlow through reticulate) and the vignette's code
# (R CMD build already knitted it). sparklyr and keras3 (Suggests) are not installable here.
# --ignore-vignettes: R CMD build (r-build) ran the vignette's code already, to build it; the check would run
# it a second time.
test-r: r-build
	cd build && _R_CHECK_FORCE_SUGGESTS_=false _R_CHECK_SYSTEM_CLOCK_=0 _R_CHECK_CRAN_INCOMING_REMOTE_=FALSE \
	  R CMD check --no-manual --no-build-vignettes --ignore-vignettes $(notdir $(R_TARBALL)); \
	  status=$$?; sh ../tests/r-check-summary.sh tfbarrier.Rcheck; summary=$$?; \
	  [ $$status -eq 0 ] && [ $$summary -eq 0 ]

# The R tarball carries the Python project (sources, pyproject, README) under inst/python, copied here,
# never edited by hand: install_tfbarrier() pip-installs it. R CMD build copies the whole directory it is
# given before .Rbuildignore prunes it, so it gets a copy without .venv and build/ (3.8 GB: 87 s of copying).
r-build: $(RPY2_STAMP)
	rm -rf inst/python build/r-source && mkdir -p inst/python/python build/r-source
	cp -r python/tfbarrier inst/python/python/ && cp pyproject.toml README.md inst/python/
	find inst/python -name __pycache__ -prune -exec rm -rf {} +
	tar -c --exclude-vcs --exclude=./.venv --exclude=./build --exclude=./site --exclude=./dist --exclude=./docs/r . \
	  | tar -x -C build/r-source
	cd build && R CMD build r-source && rm -rf r-source

# Into R's first library (the site library when run as root): library(tfbarrier) works in any R session
# after this; it finds tfbarrier's Python through TFBARRIER_PYTHON (this .venv) or install_tfbarrier().
r-install: r-build
	R CMD INSTALL $(R_TARBALL)

r-deps:
	@Rscript -e 'for (p in c("reticulate", "testthat", "jsonlite", "knitr", "markdown")) library(p, character.only = TRUE)' \
	  >/dev/null 2>&1 || { echo "installing R from Debian (apt-get)"; apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(R_DEBS); }

$(RPY2_STAMP): $(STAMP) | r-deps
	$(PIP) install -q $(CONSTRAINTS) $(RPY2)
	touch $@

# spark-tensorflow-distributor (a peer in bench/fit_bench.py) is installed only on the benchmarks' path.
BENCH_SITE := build/bench-site
BENCH_PY := PYTHONPATH=$(abspath $(BENCH_SITE)) $(PY)

$(BENCH_SITE)/.installed: $(STAMP)
	$(PIP) install -q --no-deps --target $(BENCH_SITE) spark-tensorflow-distributor==1.0.0
	touch $@

# The revision before shards were streamed: fit_bench and memory_bench run it next to this tree.
STREAMING_BASELINE := 74a8fa1

# Every table of bench/README.md, rerun: each target runs the command its section names (its "<!-- run"
# line; tests/python/test_bench_readme.py holds the two together) and rewrites that section. Hours on 2 cores;
# the hosts benchmarks make network namespaces (root). `make bench-fit-cnn` reruns one table.
BENCH_TABLES := fit-cnn fit-large gap scaling feed environment predict predict-no-onednn memory first-step \
                anatomy anatomy-large large-models large-models-checkpoint sparklyr vector-columns tracking \
                hosts faults scaling-model allocator exchange memory-estimate cpu-pool speed-onednn keras3-paths \
                encryption-native encryption-translated hosts-encryption text memory-estimate-lora preset-120m preset-1b preset-250m-model-object \
                quantized-lora-120m quantized-lora-1b quantized-lora-3b memory-estimate-text-and-archive memory-estimate-sharded \
                warm-start ring-model hosts-overlap hosts-overlap-mlp link sharded-optimizer largest-model memory-estimate-layers
.PHONY: bench bench-all bench-quick $(addprefix bench-,$(BENCH_TABLES))
bench bench-all: $(addprefix bench-,$(BENCH_TABLES))

bench-fit-cnn: venv $(BENCH_SITE)/.installed
	$(BENCH_PY) bench/fit_bench.py --model cnn --rounds 2
bench-fit-large: venv $(BENCH_SITE)/.installed
	$(BENCH_PY) bench/fit_bench.py --model large --rounds 2
bench-gap: venv
	$(PY) bench/gap_bench.py --rounds 3
bench-scaling: venv $(BENCH_SITE)/.installed
	$(BENCH_PY) bench/scaling_bench.py --workers 1 2 4 --rounds 3
bench-feed: venv
	$(PY) bench/feed_bench.py --rows 100000 1000000 --rounds 3
bench-environment: venv
	$(PY) bench/env_bench.py --rounds 5
bench-predict: venv
	$(PY) bench/predict_bench.py --rows 50000 --large-rows 20000 --rounds 3
bench-predict-no-onednn: venv
	TF_ENABLE_ONEDNN_OPTS=0 $(PY) bench/predict_bench.py --rows 50000 --large-rows 5000 --rounds 3
bench-memory: venv
	$(PY) bench/memory_bench.py --gb 0.3 1 3 --baseline-ref $(STREAMING_BASELINE) --baseline-gb 0.3
bench-first-step: venv
	$(PY) bench/first_step_bench.py --rows 400000 --rounds 3
bench-anatomy: venv
	$(PY) bench/step_anatomy_bench.py --steps 200 --rounds 3
bench-anatomy-large: venv
	$(PY) bench/step_anatomy_bench.py --model large --steps 40 --rounds 5
bench-large-models: venv
	$(PY) bench/large_model_bench.py --rounds 2
bench-large-models-checkpoint: venv
	$(PY) bench/large_model_bench.py --checkpoint --rounds 3
bench-sharded-optimizer: venv
	$(PY) bench/sharded_bench.py --rounds 2 --steps 32 --models mlp61:2 mlp61:4 deep65:2 deep65:4
# The largest Adam model 2 workers train, replicated and sharded (issue 74): a fit near this machine's memory each.
bench-largest-model: venv
	$(PY) bench/largest_model_bench.py
bench-sparklyr: venv
	$(PY) bench/sparklyr_bench.py --rows 1000000 --rounds 3
bench-vector-columns: venv
	PYTHONPATH=bench $(PY) bench/vector_bench.py --rows 20000 --width 512 --rounds 3
bench-tracking: venv
	PYTHONPATH=bench $(PY) bench/tracking_bench.py --rows 8192 --epochs 4 --rounds 3
bench-hosts: venv $(BENCH_SITE)/.installed
	$(BENCH_PY) bench/hosts_bench.py --models cnn large --rates unshaped 10gbit 1gbit 100mbit --hosts 2 3 --rounds 3 --contenders-on-three default
bench-faults: venv
	PYTHONPATH=bench $(PY) bench/faults_bench.py --rounds 2
bench-scaling-model: venv
	$(PY) bench/scaling_model.py --rounds 3
bench-allocator: venv
	$(PY) bench/allocator_bench.py --rounds 3
bench-exchange: venv
	$(PY) bench/exchange_bench.py --rounds 3 --baseline-ref cb33e45
bench-memory-estimate: venv
	$(PY) bench/memory_estimate_bench.py --rounds 1 --models cnn cnn-wide mlp12 mlp61 mlp150 mlp300 --baseline-ref 8df67d9
bench-memory-estimate-lora: venv
	$(PY) bench/memory_estimate_bench.py --rounds 2 --models lora --optimizers adam --section=-lora
# A text fit's estimate (traced at its preprocessor's length) and a model object's load (its archive unpacked), each
# beside the revision before (issue 74, items 3 and 4)
bench-memory-estimate-text-and-archive: venv
	$(PY) bench/memory_estimate_bench.py --rounds 2 --models lora text --optimizers adam --baseline-ref 8400196 --section=-text-and-archive
# The estimate of a fit whose optimizer's state is sharded, against its cold training processes' peaks (issue 74).
# The ring's step counted by its largest variable (issue 74): a model of many layers beside MLPs mostly one matrix.
bench-memory-estimate-layers: venv
	$(PY) bench/memory_estimate_bench.py --rounds 1 --models deep65 mlp12 mlp61 mlp150 mlp300 --section=-layers
bench-memory-estimate-sharded: venv
	$(PY) bench/memory_estimate_bench.py --rounds 2 --models deep65 mlp61 mlp150 --optimizers momentum adam --sharded --section=-sharded
# A LoRA fine-tune of a preset the training processes load, against one plain process (issue 60).
bench-preset-120m: venv
	$(PY) bench/preset_bench.py --size 120m --rounds 2 --steps 6
bench-preset-1b: venv
	$(PY) bench/preset_bench.py --size 1b --rounds 2 --steps 4
# The same LoRA fine-tune of a 246 M preset fitted as a model object the driver loaded, beside the preset by name and
# one plain process (issue 74, item 4).
bench-preset-250m-model-object: venv
	$(PY) bench/preset_bench.py --size 250m --rounds 2 --steps 6 --model-object
# The same LoRA fine-tune over a float32 backbone, over one each process quantizes to int8, and from a preset
# saved in int8, side by side (issue 74).
bench-quantized-lora-120m: venv
	$(PY) bench/preset_bench.py --quantized --size 120m --rounds 2 --steps 6
bench-quantized-lora-1b: venv
	$(PY) bench/preset_bench.py --quantized --size 1b --rounds 2 --steps 4
# The largest preset whose LoRA fine-tune trains on 2 workers here: 3.4 B parameters, saved in int8 (issue 74).
bench-quantized-lora-3b: venv
	$(PY) bench/preset_bench.py --quantized --size 3b --rounds 2 --steps 3
bench-cpu-pool: venv
	$(PY) bench/cpu_pool_bench.py --rounds 3
bench-warm-start: venv
	$(PY) bench/warm_start_bench.py --baseline-ref f68997f --fits 4 --rounds 3
# What the driver link's proof and the files' digests cost: time to first step and predict's first call (issue 72).
bench-link: venv
	$(PY) bench/link_bench.py --baseline-ref a882286 --fits 2 --rounds 3
# The ring alone at 2 to 16 ranks on loopback, against its latency-bandwidth model (issue 59).
bench-ring-model: venv
	$(PY) bench/ring_model_bench.py --ranks 2 4 8 16 --rounds 3
bench-speed-onednn: venv
	$(PY) bench/cpu_pool_bench.py --onednn --rounds 3
bench-keras3-paths: venv
	$(PY) bench/keras3_paths_bench.py --rounds 3 --models cnn mlp61-adam
bench-encryption-native: venv
	$(PY) bench/encryption_bench.py --rounds 3 --models cnn mlp61-adam --path native
bench-encryption-translated: venv
	$(PY) bench/encryption_bench.py --rounds 3 --models cnn mlp61-adam --path translated
bench-text: venv
	$(PY) bench/text_bench.py --prompts 256 --fit-rows 4096 --rounds 3
bench-hosts-encryption: venv $(BENCH_SITE)/.installed
	$(BENCH_PY) bench/hosts_bench.py --models cnn large --rates unshaped 1gbit 100mbit --hosts 2 --rounds 2 --contenders default tls strategy by-hand --section=-encryption
bench-hosts-overlap: venv $(BENCH_SITE)/.installed
	$(BENCH_PY) bench/hosts_bench.py --models cnn large --rates unshaped 1gbit 100mbit --hosts 2 --rounds 3 --contenders default packs first-layers-first --section=-overlap
bench-hosts-overlap-mlp: venv $(BENCH_SITE)/.installed
	$(BENCH_PY) bench/hosts_bench.py --models mlp --rates unshaped 1gbit --hosts 2 --rounds 2 --contenders default first-layers-first --section=-overlap-mlp

# Speed, memory and predict in under 15 minutes, one round each on small data: a quick look, written to
# build/bench-quick.md (TFBARRIER_BENCH_README), never over bench/README.md's tables.
bench-quick: venv
	rm -f build/bench-quick.md
	TFBARRIER_BENCH_README=build/bench-quick.md $(PY) bench/cpu_pool_bench.py --onednn --rounds 1
	TFBARRIER_BENCH_README=build/bench-quick.md $(PY) bench/memory_estimate_bench.py --rounds 1 --models cnn mlp12
	TFBARRIER_BENCH_README=build/bench-quick.md $(PY) bench/predict_bench.py --rows 10000 --large-rows 2000 --rounds 1
	@echo "bench-quick: build/bench-quick.md"

# The documentation site (mkdocs.yml: MkDocs, Material, mkdocstrings from the docstrings), with the R
# package's pkgdown site (pkgdown/build.R, _pkgdown.yml) inside it as site/r/, offline, warnings failing
# either build. Open site/index.html.
DOCS_DEBS := r-cran-pkgdown r-cran-rmarkdown r-cran-pkgload
docs: $(STAMP) docs-deps
	Rscript pkgdown/build.R
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet
	@echo "docs: site/index.html (the R package's site: site/r/index.html)"

docs-deps: | r-deps
	@Rscript -e 'for (p in c("pkgdown", "rmarkdown", "pkgload")) library(p, character.only = TRUE)' >/dev/null 2>&1 || { \
	  echo "installing pkgdown from Debian (apt-get)"; apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(DOCS_DEBS); }
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing chromium, which looks at the built site (apt-get)"; apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; }

# The docs built and looked at: every Python block of the guides run or its calls checked (test_docs.py,
# which prints how many), the R blocks' calls matched to the functions' formals (test-docs.R, which R CMD check
# runs too), and the built pages opened in a headless Chromium (test_docs_site.py; screenshots in
# build/docs-screenshots/). test-python leaves these files to it.
DOCS_TESTS := tests/python/test_docs.py tests/python/test_docs_site.py
test-docs: docs
	$(PY) -m pytest -q -p no:cacheprovider $(DOCS_TESTS)
	Rscript -e 'pkgload::load_all(".", quiet = TRUE); testthat::test_file("tests/testthat/test-docs.R", stop_on_failure = TRUE)'

# The release's files: the wheel and the sdist (pip and build, each in an isolated build environment), and the
# R source package r-build makes (its vignette knitted: Spark and TensorFlow run). setuptools' leftovers of a
# previous build go first: it copies into build/lib without removing what is gone from python/.
dist: $(STAMP) r-build
	rm -rf dist build/lib build/bdist.* python/*.egg-info && mkdir -p dist
	$(PIP) wheel -q --no-deps -w dist .
	$(PY) -m build --sdist --outdir dist .
	cp $(R_TARBALL) dist/
	@ls -l dist

venv: system-deps $(STAMP)

# Java for Spark; ip and tc (iproute2) for the multi-host tests (tests/python/support/hosts.py);
# everything else comes from PyPI into .venv.
system-deps:
	@command -v java >/dev/null 2>&1 || { \
	  echo "installing Java 17 for Spark (apt-get)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless; }
	@{ command -v ip && command -v tc; } >/dev/null 2>&1 || { \
	  echo "installing iproute2 for the multi-host tests (apt-get)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iproute2; }

# tf-keras declares a dependency on the full `tensorflow` wheel (+600 MB next to tensorflow-cpu):
# it is installed with --no-deps, after tensorflow-cpu; so are keras-hub (the tests' KerasHub models) and
# tensorflow-text, which keras-hub asks for, and then keras-hub's other dependencies.
$(STAMP): pyproject.toml requirements/constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(CONSTRAINTS) -e ".[dev,docs,connect,optuna,mlflow]" "tensorflow-cpu==2.21.*" "tensorboard==2.21.*"
	$(PIP) install -q $(CONSTRAINTS) --no-deps "tf-keras==2.21.*" "keras-hub==0.32.*" "tensorflow-text==2.21.*"
	$(PIP) install -q $(CONSTRAINTS) regex rich "kagglehub!=1.0.1" "kagglesdk==0.1.28" sentencepiece tokenizers
	$(PY) -c "import numpy, pyarrow, pyspark, tensorflow, tf_keras, keras_hub; assert numpy.__version__ < '2'"
	touch $@

clean:
	rm -rf $(VENV) *.egg-info python/*.egg-info .pytest_cache build inst/python site docs/r dist
