"""Per-executor Python environments: built once per host, cached, locked, never half-used; or shipped
as an archive. Fast by design: system_site_packages=True plus a tiny wheel this test writes into a
local wheelhouse, so no test downloads TensorFlow."""

import os
import subprocess
import sys
import tarfile
import time
import zipfile

import pytest
from conftest import digits_cnn

import tfbarrier
from tfbarrier.spark import environment
from tfbarrier.spark.environment import PythonEnv
from tfbarrier.errors import EnvironmentBuildError


def write_wheel(wheelhouse, version="1.0"):
    """tfbarrier_probe-<version>: one module with VALUE = "probe-<version>"."""
    name = f"tfbarrier_probe-{version}"
    path = os.path.join(wheelhouse, f"{name}-py3-none-any.whl")
    files = {
        "tfbarrier_probe.py": f'VALUE = "probe-{version}"\n',
        f"{name}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: tfbarrier-probe\nVersion: {version}\n",
        f"{name}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: tfbarrier-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    with zipfile.ZipFile(path, "w") as whl:
        for file, text in files.items():
            whl.writestr(file, text)
        whl.writestr(f"{name}.dist-info/RECORD", "".join(f"{f},,\n" for f in files) + f"{name}.dist-info/RECORD,,\n")
    return path


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("wheelhouse"))
    write_wheel(path)
    return path


@pytest.fixture
def home(tmp_path):
    """A workon_home of this test's own: each test passes alone and in any order."""
    return str(tmp_path / "envs")


def probe_env(home, wheelhouse, requirement="tfbarrier-probe==1.0"):
    return PythonEnv(requirements=[requirement], workon_home=home, find_links=[wheelhouse], no_index=True,
                     system_site_packages=True)


def import_the_probe():
    """A callbacks factory that fails the fit unless the environment's package is importable."""
    import tfbarrier_probe  # noqa: F401

    return []


def builds(home):
    log = os.path.join(home, environment.BUILD_LOG)
    return open(log).read().splitlines() if os.path.exists(log) else []


def fit(df, env):
    return tfbarrier.fit(df, digits_cnn(), features="pixels", label="digit", epochs=1, batch_size=64,
                         num_workers=2, env=env, callbacks=import_the_probe, verbose=0)


def test_two_tasks_build_a_new_environment_once_and_both_train_in_it(digits_df, home, wheelhouse):
    env = probe_env(home, wheelhouse)
    result = fit(digits_df, env)
    target = os.path.join(home, f"tfbarrier-{env.key()}")
    assert len(builds(home)) == 1
    assert sorted(w["environment"]["built"] for w in result.workers) == [False, True]
    assert {w["python_prefix"] for w in result.workers} == {target}
    assert os.path.exists(os.path.join(target, environment.MARKER))


def test_a_second_fit_is_a_cache_hit_with_its_bootstrap_time_reported(digits_df, home, wheelhouse):
    first = fit(digits_df, probe_env(home, wheelhouse))
    second = fit(digits_df, probe_env(home, wheelhouse))
    assert len(builds(home)) == 1
    assert [w["environment"]["built"] for w in second.workers] == [False, False]
    build_seconds = max(w["timings"]["environment"] for w in first.workers)
    assert all(0 <= w["timings"]["environment"] < build_seconds for w in second.workers)  # found, not built
    assert "environment" in second.timings


def test_changed_requirements_give_another_environment(home, wheelhouse):
    one, other = probe_env(home, wheelhouse), probe_env(home, wheelhouse, "tfbarrier-probe>=1.0")
    assert one.key() != other.key()
    assert one.key() == probe_env(home, wheelhouse).key()
    assert PythonEnv(["b", "a"]).key() == PythonEnv(["a", "b"]).key()  # order does not matter


def test_a_half_built_environment_is_rebuilt_not_used(digits_df, home, wheelhouse):
    env = probe_env(home, wheelhouse, "tfbarrier-probe<2")
    target = os.path.join(home, f"tfbarrier-{env.key()}")
    os.makedirs(os.path.join(target, "bin"))
    open(os.path.join(target, "leftover"), "w").close()  # a killed build: no completion marker
    before = len(builds(home))
    result = fit(digits_df, env)
    assert len(builds(home)) == before + 1
    assert not os.path.exists(os.path.join(target, "leftover"))
    assert {w["python_prefix"] for w in result.workers} == {target}


def test_a_requirement_that_cannot_be_installed_fails_fast_naming_it(digits_df, home, wheelhouse):
    started = time.time()
    with pytest.raises(EnvironmentBuildError) as failure:
        fit(digits_df, probe_env(home, wheelhouse, "tfbarrier-no-such-package==9.9"))
    assert time.time() - started < 300  # a failed build ends the fit: nothing waits for a timeout
    message = str(failure.value)
    assert "tfbarrier-no-such-package==9.9" in message and failure.value.host and "on " + failure.value.host in message
    assert "No matching distribution" in message or "Could not find a version" in message


def test_an_environment_archive_is_shipped_and_used(spark, digits_df, home, wheelhouse, tmp_path):
    packed = tmp_path / "packed"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(packed)], check=True)
    environment._parent_site_packages(str(packed))
    subprocess.run([str(packed / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index", "--find-links",
                    wheelhouse, "tfbarrier-probe"], check=True)
    archive = tmp_path / "probe-env.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(packed, arcname=".")
    result = fit(digits_df, PythonEnv.from_archive(str(archive)))
    prefixes = {w["python_prefix"] for w in result.workers}
    assert len(prefixes) == 1 and prefixes.pop().endswith("probe-env.tar.gz")
