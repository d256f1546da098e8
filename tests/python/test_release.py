"""One version for the release: the Python package's (pyproject.toml, tfbarrier.__version__), the R package's
(DESCRIPTION, which names the R tarball make builds) and the changelog's newest heading (NEWS.md) agree."""

import os
import re
import tomllib

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def read(name):
    with open(os.path.join(ROOT, name)) as f:
        return f.read()


def test_the_python_and_r_packages_and_the_changelog_have_one_version():
    import tfbarrier

    python = tomllib.loads(read("pyproject.toml"))["project"]["version"]
    r = re.search(r"^Version: (\S+)$", read("DESCRIPTION"), re.M).group(1)
    news = re.search(r"^# tfbarrier (\S+)", read("NEWS.md"), re.M).group(1)
    assert python == r == news == tfbarrier.__version__, (python, r, news, tfbarrier.__version__)
