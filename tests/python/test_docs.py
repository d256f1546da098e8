"""The docs as their readers use them: every Python block in the guides (docs/**/*.md, README.md) runs, here or on
the Python suite's local Spark, or is marked cluster-only and has its calls checked against tfbarrier's signatures;
the README stays short and every capability it lists is a page of the site's navigation; the reference and the
errors' guide cover the public API.

A marker is an HTML comment on the line above a block's fence, which the site does not show:

    <!-- cluster-only -->
    ```python
    result = tfbarrier.fit(spark.table("training"), model, features="features", label="label", num_workers=16)
    ```

    <!-- with spark: digits -->
    ```python
    result = tfbarrier.fit(df, model, features="pixels", label="digit")
    ```

A block without one runs here, page by page in one namespace (a page's blocks build on each other), in a temporary
directory, with no Spark: a model built, a preset named, an environment described, a bad call refused. A block
marked ``with spark`` runs in tests/python/test_docs_examples.py, on the Python suite's local Spark and tiny data,
its page's other runnable blocks before it; after the colon, the scene that gives it what a reader already has in
hand (``df``, ``model``...: that file says what each scene holds). A cluster-only block (one that needs a real
cluster: a YARN master, an attached JVM) is parsed (it must be Python) and every call of tfbarrier's functions,
classes and of the methods of what they return (``result = tfbarrier.fit(...)``: a FitResult) is bound to their
signatures: an argument renamed or removed in the code fails here, not in the reader's hands. The ``with spark``
blocks are checked so too. tests/testthat/test-docs.R does the same for the R blocks, against the functions'
formals. No Spark, no training here: a few seconds and TensorFlow's import.
"""

import ast
import dataclasses
import inspect
import os
import re
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DOCS = os.path.join(ROOT, "docs")
MARKER = "<!-- cluster-only -->"
SPARK_MARKER = re.compile(r"^<!-- with spark(?:: (?P<scene>[\w-]+))? -->$")
README_MAX_LINES = 250
PYTHON = ("python", "py")
FENCE = re.compile(r"^(?P<indent> {0,3}|    )(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
COUNTS = {"run": 0, "checked": 0, "calls": 0}
NO_SCENE = ""


@dataclasses.dataclass
class Block:
    page: str  # the file, relative to the repository
    line: int  # the fence's line, from 1
    language: str
    code: str
    cluster_only: bool
    scene: str = None  # a block that runs on local Spark: its scene's name (NO_SCENE: none); None: no Spark

    @property
    def on_spark(self):
        return self.scene is not None

    @property
    def where(self):
        return f"{self.page}:{self.line}"


def pages():
    """The Markdown files whose blocks readers copy: the guides (not the pkgdown site built into docs/r) and the
    README."""
    found = []
    for directory, subdirectories, files in os.walk(DOCS):
        subdirectories[:] = sorted(d for d in subdirectories if os.path.join(directory, d) != os.path.join(DOCS, "r"))
        found += [os.path.relpath(os.path.join(directory, f), ROOT) for f in sorted(files) if f.endswith(".md")]
    return ["README.md", *found]


def blocks(page):
    """The fenced code blocks of ``page``, CommonMark's way: a fence closes on the same character, at least as
    long, with no info string; a fence in a tab (indented four spaces) is dedented."""
    with open(os.path.join(ROOT, page)) as f:
        lines = f.read().splitlines()
    found, open_fence, previous = [], None, ""
    for number, line in enumerate(lines, 1):
        match = FENCE.match(line)
        if open_fence is None:
            if match:
                indent = len(match["indent"])
                spark = SPARK_MARKER.match(previous.strip())
                scene = None if spark is None else spark["scene"] or NO_SCENE
                open_fence = (match["fence"], indent, number, match["info"].strip().split(" ")[0].lower(),
                              previous.strip() == MARKER, scene, [])
            elif line.strip():
                previous = line
            continue
        fence, indent, start, language, marked, scene, body = open_fence
        if match and match["fence"][0] == fence[0] and len(match["fence"]) >= len(fence) and not match["info"].strip():
            found.append(Block(page, start, language, "\n".join(body), marked, scene))
            open_fence, previous = None, ""
        else:
            body.append(line[indent:] if line[:indent].strip() == "" else line)
    assert open_fence is None, f"{page}:{open_fence[2]}: a fence that never closes"
    return found


ALL_BLOCKS = [block for page in pages() for block in blocks(page)]
PYTHON_BLOCKS = [block for block in ALL_BLOCKS if block.language in PYTHON]
RUN_HERE = [block for block in PYTHON_BLOCKS if not block.cluster_only and not block.on_spark]
RUN_PAGES = sorted({block.page for block in RUN_HERE})
ON_SPARK = [block for block in PYTHON_BLOCKS if block.on_spark]
CLUSTER_ONLY = [block for block in PYTHON_BLOCKS if block.cluster_only]
CHECKED = CLUSTER_ONLY + ON_SPARK
R_BLOCKS = [block for block in ALL_BLOCKS if block.language == "r"]


@pytest.fixture(scope="module", autouse=True)
def counts(request):
    """Say how many blocks ran and how many had their calls checked, on the terminal, at the end."""
    yield
    plugins = request.config.pluginmanager
    reporter, capture = plugins.getplugin("terminalreporter"), plugins.getplugin("capturemanager")
    line = (f"docs examples: of {len(PYTHON_BLOCKS)} Python blocks in {len(pages())} pages, {COUNTS['run']} run here, "
            f"{len(ON_SPARK)} run on local Spark (test_docs_examples.py, in the Python suite), {len(CLUSTER_ONLY)} "
            f"cluster-only; {COUNTS['checked']} had their calls checked ({COUNTS['calls']} calls bound to tfbarrier's "
            f"signatures); of {len(R_BLOCKS)} R blocks, {sum(b.on_spark for b in R_BLOCKS)} run on local Spark "
            f"(test-docs-examples.R, in R CMD check), all checked (test-docs.R)")
    if reporter is None or capture is None:  # pytest-xdist's workers: no terminal of their own
        print(line)
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line("")
        reporter.write_line(line)


# ---- the blocks that run ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("page", RUN_PAGES)
def test_a_pages_python_blocks_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": f"docs:{page}"}
    for block in RUN_HERE:
        if block.page == page:
            try:
                exec(compile(block.code, block.where, "exec"), namespace)
            except Exception as exc:
                raise AssertionError(f"{block.where}: the block failed ({type(exc).__name__}: {exc}); mark it "
                                     f"<!-- with spark: SCENE --> if it needs Spark, {MARKER} if a real "
                                     f"cluster") from exc
            COUNTS["run"] += 1


# ---- the blocks that are checked -----------------------------------------------------------------------------------

def _fit_parameters():
    import tfbarrier

    return set(inspect.signature(tfbarrier.fit).parameters) - {"data", "model", "unknown"}


class Calls(ast.NodeVisitor):
    """Resolves the names a block binds to tfbarrier (its imports, and what its calls return) and binds every call
    of them to its signature. What it cannot resolve (the user's own objects, pyspark's, Keras's) it leaves alone."""

    def __init__(self, where):
        import tfbarrier

        self.where = where
        self.names = {"tfbarrier": tfbarrier}  # name -> a tfbarrier object, or ("instance", class)
        self.problems = []
        self.calls = 0
        self.tfbarrier = tfbarrier

    # what the names are
    def visit_Import(self, node):
        for alias in node.names:
            if alias.name == "tfbarrier" or alias.name.startswith("tfbarrier."):
                self.names[alias.asname or alias.name.split(".")[0]] = self.tfbarrier
                if alias.asname:
                    self.names[alias.asname] = self._module(alias.name)

    def visit_ImportFrom(self, node):
        if not (node.module or "").startswith("tfbarrier"):
            return
        module = self._module(node.module)
        for alias in node.names:
            if not hasattr(module, alias.name):
                self.problems.append(f"line {node.lineno}: {node.module} has no {alias.name}")
                continue
            self.names[alias.asname or alias.name] = getattr(module, alias.name)

    def _module(self, name):
        import importlib

        return importlib.import_module(name)

    def visit_Assign(self, node):
        self.generic_visit(node)
        value = self.resolve(node.value)
        for target in node.targets:
            if isinstance(target, ast.Name):
                if value is None:
                    self.names.pop(target.id, None)
                else:
                    self.names[target.id] = value

    def visit_Attribute(self, node):
        self.resolve(node)
        self.generic_visit(node)

    def resolve(self, node):
        """The tfbarrier object ``node`` is, ("instance", class) for what a call of one returns, or None."""
        if isinstance(node, ast.Name):
            return self.names.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value)
            if base is None:
                return None
            if isinstance(base, tuple):
                cls = base[1]
                fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
                if node.attr not in fields and not hasattr(cls, node.attr):
                    self.problems.append(f"line {node.lineno}: a {cls.__name__} has no {node.attr!r}")
                    return None
                member = inspect.getattr_static(cls, node.attr, None)
                return ("method", cls, node.attr) if callable(member) and not isinstance(member, property) else None
            if not hasattr(base, node.attr):
                self.problems.append(f"line {node.lineno}: {getattr(base, '__name__', base)} has no {node.attr!r}")
                return None
            return getattr(base, node.attr)
        if isinstance(node, ast.Call):
            return self.returned(self.resolve(node.func))
        return None

    def returned(self, called):
        """What a call of ``called`` returns, as far as the docs' readers use it."""
        api = self.tfbarrier
        returns = {id(api.fit): api.FitResult, id(api.tune): api.TuneResult}
        if isinstance(called, type) and called.__module__.startswith("tfbarrier"):
            return ("instance", called)
        if getattr(called, "__func__", None) is getattr(api.PythonEnv.from_archive, "__func__", ()):
            return ("instance", api.PythonEnv)
        if id(called) in returns:
            return ("instance", returns[id(called)])
        return None

    # the calls
    def visit_Call(self, node):
        self.generic_visit(node)
        called = self.resolve(node.func)
        if called is None or called is self.tfbarrier:
            return
        if isinstance(called, tuple) and called[0] == "method":
            function, bound = getattr(called[1], called[2]), True
        elif callable(called) and getattr(called, "__module__", "").startswith("tfbarrier"):
            function, bound = called, False
        else:
            return
        self.calls += 1
        self.bind(function, node, bound)

    def bind(self, function, node, bound):
        name = getattr(function, "__qualname__", function)
        try:
            signature = inspect.signature(function)
        except (TypeError, ValueError):
            return
        parameters = dict(signature.parameters)
        if bound:
            parameters.pop(next(iter(parameters)), None)  # self
            signature = signature.replace(parameters=list(parameters.values()))
        extra = [p for p in parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD]
        # fit's, run's and apply's **unknown is there to refuse a misspelt keyword in words, not to take one;
        # tune's **fit_kwargs takes fit's arguments
        takes = (set() if not extra or extra[0].name == "unknown" else
                 _fit_parameters() if extra[0].name == "fit_kwargs" else None)
        named = [p.name for p in parameters.values() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
        keywords = [keyword.arg for keyword in node.keywords if keyword.arg is not None]
        for keyword in keywords:
            if keyword not in named and takes is not None and keyword not in takes:
                self.problems.append(f"line {node.lineno}: {name}() takes no argument {keyword!r}")
        starred = any(isinstance(a, ast.Starred) for a in node.args) or len(keywords) < len(node.keywords)
        if not starred:
            try:
                signature.bind(*[None] * len(node.args), **{k: None for k in keywords if k in named})
            except TypeError as exc:
                self.problems.append(f"line {node.lineno}: {name}(): {exc}")
        for keyword in node.keywords:
            if keyword.arg == "communication":
                self.communication(keyword.value, node.lineno)
            if keyword.arg == "fitArgs" and isinstance(keyword.value, ast.Dict):
                for key in keyword.value.keys:
                    if isinstance(key, ast.Constant) and key.value not in _fit_parameters():
                        self.problems.append(f"line {node.lineno}: fitArgs has {key.value!r}, which fit does not take")

    def communication(self, node, line):
        """A literal ``communication={...}``: its options as fit checks them."""
        from tfbarrier import exchange
        from tfbarrier.errors import InvalidArgumentError

        try:
            options = eval(compile(ast.Expression(node), "communication", "eval"), {"__builtins__": {}})
        except Exception:  # noqa: BLE001 - not a literal: a name the block made
            return
        try:
            exchange.check_communication(options)
        except InvalidArgumentError as exc:
            self.problems.append(f"line {line}: communication={options!r}: {exc}")


def check(block, before=()):
    """``block``'s calls checked, the names bound by the page's ``before`` blocks known (as a reader reads a page:
    ``result`` of one block is the FitResult another block fitted). ``tfbarrier`` is the package everywhere."""
    calls = Calls(block.where)
    for earlier in before:
        calls.visit(ast.parse(earlier.code, earlier.where))
    calls.problems, calls.calls = [], 0
    try:
        tree = ast.parse(block.code, block.where)
    except SyntaxError as exc:
        raise AssertionError(f"{block.where}: not Python: {exc}") from exc
    calls.visit(tree)
    calls.problems = list(dict.fromkeys(calls.problems))  # a chain resolved twice says it once
    return calls


def earlier_blocks(block):
    """The Python blocks above ``block`` on its page."""
    return [b for b in PYTHON_BLOCKS if b.page == block.page and b.line < block.line]


@pytest.mark.parametrize("block", CHECKED, ids=[block.where for block in CHECKED])
def test_the_calls_of_a_block_that_needs_spark_or_a_cluster_take_the_arguments_it_gives(block):
    calls = check(block, earlier_blocks(block))
    assert calls.problems == [], f"{block.where}: " + "; ".join(calls.problems)
    COUNTS["checked"] += 1
    COUNTS["calls"] += calls.calls


def test_the_check_catches_a_renamed_argument_a_misspelt_attribute_and_a_bad_option():
    block = Block("planted.md", 1, "python", "\n".join([
        "import tfbarrier",
        "from tfbarrier.ml import KerasEstimator",
        "result = tfbarrier.fit(df, model, features='x', label='y', epoch=3)",
        "result.histroy",
        "result.save('m.keras', overwrite=True)",
        "tfbarrier.predict(df, result, feature='x')",
        "tfbarrier.tune(df, build, {}, features='x', label='y', workers=2)",
        "tfbarrier.fitt(df)",
        "tfbarrier.PythonEnv.from_archive('env.tar.gz', python='3.11')",
        "KerasEstimator(model=model, num_workers=2, fitArgs={'epochz': 1})",
        "tfbarrier.fit(df, model, features='x', communication={'compresion': 'fp16'})",
        "tfbarrier.fit(df, model, features='x', communication={'shard': 'gradients'})",
        "tfbarrier.fit(df, features='x')",
    ]), True)
    problems = "\n".join(check(block).problems)
    for caught in ("'epoch'", "'histroy'", "'overwrite'", "'feature'", "'workers'", "'fitt'", "'python'",
                   "'num_workers'", "'epochz'", "compresion", "gradients", "missing a required argument: 'model'"):
        assert caught in problems, (caught, problems)


def test_most_python_blocks_run_the_rest_are_checked_and_r_blocks_are_marked():
    assert len(PYTHON_BLOCKS) == len(RUN_HERE) + len(ON_SPARK) + len(CLUSTER_ONLY)
    assert not any(block.cluster_only and block.on_spark for block in PYTHON_BLOCKS)
    # most of the guides' blocks, R's included, run somewhere; only what needs a real cluster does not
    ran = len(RUN_HERE) + len(ON_SPARK) + sum(block.on_spark for block in R_BLOCKS)
    assert ran > (len(PYTHON_BLOCKS) + len(R_BLOCKS)) / 2, (ran, len(PYTHON_BLOCKS), len(R_BLOCKS))
    # R blocks run nowhere here: test-docs.R checks each against the functions' formals, and
    # test-docs-examples.R runs those marked with spark, so each says which it is
    unmarked = [block.where for block in R_BLOCKS if not block.cluster_only and not block.on_spark]
    assert unmarked == [], f"R blocks with neither {MARKER} nor <!-- with spark: SCENE -->: {unmarked}"
    # a marker is for a block that follows it
    for page in pages():
        with open(os.path.join(ROOT, page)) as f:
            lines = f.read().splitlines()
        for number, line in enumerate(lines, 1):
            if line.strip() == MARKER or SPARK_MARKER.match(line.strip()):
                following = next((l for l in lines[number:] if l.strip()), "")
                assert FENCE.match(following), f"{page}:{number}: {line.strip()} with no block under it"
            elif line.strip().startswith("<!-- with"):
                raise AssertionError(f"{page}:{number}: {line.strip()}: not a marker (<!-- with spark: SCENE -->)")


# ---- the README and the site's navigation ----------------------------------------------------------------------

def nav_pages():
    """{page: depth} of mkdocs.yml's nav: 1 for a top item, 2 for an item of a top section..."""
    import yaml

    with open(os.path.join(ROOT, "mkdocs.yml")) as f:
        config = yaml.safe_load(f)
    found = {}

    def walk(items, depth):
        for item in items:
            for value in (item.values() if isinstance(item, dict) else [item]):
                if isinstance(value, list):
                    walk(value, depth + 1)
                else:
                    found.setdefault(value, depth)

    walk(config["nav"], 1)
    return found


def included(page):
    """The repository's files a docs page includes whole (pymdownx.snippets: --8<-- "file")."""
    with open(os.path.join(DOCS, page)) as f:
        return re.findall(r'^--8<-- "([^"]+)"$', f.read(), re.M)


def test_the_readme_is_short():
    with open(os.path.join(ROOT, "README.md")) as f:
        assert len(f.read().splitlines()) <= README_MAX_LINES


def test_every_capability_the_readme_lists_is_two_clicks_from_the_sites_home():
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    table = re.search(r"^## What it does\n(.*?)(?=^## )", readme, re.M | re.S).group(1)
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| capability")]
    assert len(rows) >= 15, rows
    nav = nav_pages()
    by_include = {source: page for page in nav if page.endswith(".md") for source in included(page)}
    for row in rows:
        links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", row)
        assert len(links) == 1, f"a README row links one guide: {row}"
        target = links[0]
        page = target[len("docs/"):] if target.startswith("docs/") else by_include.get(target)
        assert page is not None and os.path.exists(os.path.join(DOCS, page)), f"{target}: no page of the site"
        assert nav.get(page, 99) <= 2, f"{page} is not in mkdocs.yml's nav within two clicks of the home page"


def test_the_reference_documents_every_public_call_and_the_errors_guide_every_error():
    import tfbarrier
    from tfbarrier import errors

    reference = ""
    for name in sorted(os.listdir(os.path.join(DOCS, "reference"))):
        with open(os.path.join(DOCS, "reference", name)) as f:
            reference += f.read()
    documented = set(re.findall(r"^::: \S+\.(\w+)$", reference, re.M)) | set(re.findall(r"^::: tfbarrier\.(\w+)$", reference, re.M))
    public = set(tfbarrier.__all__) - {"__version__", "errors"}
    assert public - documented == set(), f"public calls with no reference page: {sorted(public - documented)}"
    assert "::: tfbarrier.errors" in reference and "::: tfbarrier.ml" in reference
    with open(os.path.join(DOCS, "guides", "troubleshooting.md")) as f:
        guide = f.read()
    classes = {name for name, value in vars(errors).items()
               if isinstance(value, type) and issubclass(value, errors.TfBarrierError) and value is not errors.TfBarrierError
               and name == value.__name__}
    missing = sorted(name for name in classes if f"| `{name}` |" not in guide)
    assert missing == [], f"error classes the guide does not explain: {missing}"
    with open(os.path.join(DOCS, "reference", "errors.md")) as f:
        listed = f.read()
    assert sorted(name for name in classes if name not in listed) == []


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
