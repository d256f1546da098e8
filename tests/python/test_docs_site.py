"""The built site, looked at (`make test-docs`, after `make docs`): a headless Chromium opens the home page, fit's
reference page and the R package's page of spark_tf_fit() with the network cut off (every host name resolves to
nothing: the site must render offline), and each page must have its title, its navigation, a code block and the
words it is for. Screenshots of them stay in build/docs-screenshots/, to be looked at."""

import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SITE = os.path.join(ROOT, "site")
SHOTS = os.path.join(ROOT, "build", "docs-screenshots")

# page: (file in site/, what its <title> says, the navigation's mark, a code block's mark, words it must show)
PAGES = {
    "home": ("index.html", "tfbarrier", 'class="md-tabs"', 'highlight',
             ["Train TensorFlow/Keras models across a Spark cluster", "When things go wrong"]),
    "fit": ("reference/fit.html", "fit - tfbarrier", 'class="md-tabs"', 'highlight',
            ["tfbarrier.fit", "num_workers", "checkpoint_dir", "Returns"]),
    "r-spark_tf_fit": ("r/reference/spark_tf_fit.html", "spark_tf_fit", 'class="navbar', "sourceCode",
                       ["Train a Keras model", "num_workers", "Guides and Python API"]),
}


def chromium():
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "no chromium on PATH: `make docs-deps` installs Debian's"
    return found


def browse(tmp_path, *args):
    command = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
               "--host-resolver-rules=MAP * ~NOTFOUND", f"--user-data-dir={tmp_path / 'profile'}", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is no PNG"
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def colours(path):
    """How many colours a screenshot has, and the share of its commonest: a blank or unstyled page has few."""
    from PIL import Image

    with Image.open(path) as image:
        small = image.convert("RGB").resize((320, 400))
        counts = small.getcolors(320 * 400)
    return len(counts), max(count for count, _ in counts) / (320 * 400)


@pytest.mark.parametrize("name", list(PAGES))
def test_a_built_page_renders_offline(name, tmp_path):
    page, title, navigation, code, words = PAGES[name]
    path = os.path.join(SITE, page)
    assert os.path.exists(path), f"{path} is not built: `make docs`"
    url = "file://" + path
    dom = browse(tmp_path, "--virtual-time-budget=3000", "--dump-dom", url)
    shown = re.search(r"<title>(.*?)</title>", dom, re.S)
    assert shown and title in shown.group(1), (name, shown and shown.group(1))
    assert navigation in dom, f"{name}: no navigation ({navigation})"
    assert code in dom and "<pre" in dom, f"{name}: no code block"
    text = re.sub(r"<[^>]+>", "", dom)
    for word in words:
        assert word in text, f"{name}: {word!r} is not on the page"
    os.makedirs(SHOTS, exist_ok=True)
    shot = os.path.join(SHOTS, f"{name}.png")
    if os.path.exists(shot):
        os.remove(shot)
    browse(tmp_path, "--window-size=1280,1600", f"--screenshot={shot}", url)
    assert png_size(shot) == (1280, 1600)
    many, commonest = colours(shot)
    assert many > 30 and commonest < 0.97, f"{name}: the screenshot looks blank ({many} colours, {commonest:.0%} one)"
