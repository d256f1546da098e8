"""ARCHITECTURE.md stays true and the house stays easy to see: its tables list every room (sub-package) and
every module of python/tfbarrier/, and nothing else; the rooms stack in floors (FLOORS), none importing one above
it; no function is over 50 code lines and no module over 400; no module reaches another module's private names;
and no import circle anywhere, bench included."""

import ast
import os
import re

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
PACKAGE = os.path.join(ROOT, "python", "tfbarrier")


def _architecture():
    with open(os.path.join(ROOT, "ARCHITECTURE.md")) as f:
        return f.read()


def _python_files(folder):
    """Every .py file under ``folder``, as paths relative to it ("spark/stage.py")."""
    found = []
    for directory, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        found += [os.path.relpath(os.path.join(directory, name), folder) for name in sorted(filenames)
                  if name.endswith(".py")]
    return found


def test_the_tables_list_every_room_and_module_and_no_other():
    text = _architecture()
    table = text[text.index("## Rooms"):text.index("## Where a new thing goes")]
    first_cells = re.findall(r"^\| ([^|]+) \|", table, re.M)  # a row's modules are in its first cell
    listed = {name for cell in first_cells for name in re.findall(r"`((?:\w+/)?\w+\.py)`", cell)}
    modules = {path for path in _python_files(PACKAGE) if not path.endswith("__init__.py") or _holds_code(path)}
    assert sorted(modules - listed) == [], "modules missing from ARCHITECTURE.md"
    assert sorted(listed - modules) == [], "ARCHITECTURE.md lists modules that do not exist"
    rooms = {path.split("/")[0] for path in modules if "/" in path}
    assert rooms == set(re.findall(r"^### `(\w+)/`", table, re.M)), "a room without its heading, or the reverse"
    assert len(rooms) >= 2


def _holds_code(path):
    """Whether a room's ``__init__.py`` holds more than its docstring (the package's own has the calls)."""
    if "/" not in path:
        return False
    with open(os.path.join(PACKAGE, path)) as f:
        body = ast.parse(f.read()).body
    return len(body) > (1 if body and isinstance(body[0], ast.Expr) else 0)


MAX_FUNCTION_LINES, MAX_MODULE_LINES, MAX_API_LINES = 50, 400, 200
SOURCES = [os.path.join(ROOT, folder, path) for folder in ("python/tfbarrier", "bench")
           for path in _python_files(os.path.join(ROOT, folder))]


def _code_lines(lines, node, docstrings):
    """Lines of ``node`` that hold code: not blank, not a comment, not a docstring."""
    return sum(1 for number in range(node.lineno, node.end_lineno + 1)
               if number not in docstrings and lines[number - 1].strip()
               and not lines[number - 1].strip().startswith("#"))


def test_no_function_is_over_50_code_lines_and_no_module_over_400_lines_and_the_api_a_thin_face():
    long_functions, long_modules = [], []
    for path in SOURCES:
        with open(path) as f:
            source = f.read()
        lines, tree = source.splitlines(), ast.parse(source)
        if len(lines) > MAX_MODULE_LINES:
            long_modules.append((os.path.relpath(path, ROOT), len(lines)))
        docstrings = {number for node in ast.walk(tree)
                      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module))
                      and node.body and isinstance(node.body[0], ast.Expr)
                      and isinstance(getattr(node.body[0], "value", None), ast.Constant)
                      and isinstance(node.body[0].value.value, str)
                      for number in range(node.body[0].lineno, node.body[0].end_lineno + 1)}
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                count = _code_lines(lines, node, docstrings)
                if count > MAX_FUNCTION_LINES:
                    long_functions.append((f"{os.path.relpath(path, ROOT)}:{node.name}", count))
    assert long_functions == [], "functions over 50 code lines: split them"
    assert long_modules == [], "modules over 400 lines: split them by concern"
    with open(os.path.join(PACKAGE, "api.py")) as f:
        assert len(f.read().splitlines()) <= MAX_API_LINES, "api.py is fit's face: its room does the work"


def _module_name(path):
    """tfbarrier's dotted name of a file of python/tfbarrier, or a bench script's own name."""
    relative = os.path.relpath(path, ROOT)
    if relative.startswith("python/"):
        name = relative[len("python/"):-3].replace("/", ".")
        return name[:-len(".__init__")] if name.endswith(".__init__") else name
    return os.path.basename(path)[:-3]


def _imports(path, name, modules=()):
    """The modules ``path`` imports (at any depth: a function's import too), as dotted names. ``from package
    import module`` is an import of the module alone when it is one of ``modules``, not of the package too."""
    with open(path) as f:
        tree = ast.parse(f.read())
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            named = {f"{base}.{alias.name}" for alias in node.names}
            found |= named if named <= set(modules) else named | {base}
    return found


# The floors of python/tfbarrier, from the ground up: a room (a sub-package, or a module at the top) imports only
# rooms of its own floor or below. What every floor needs sits on the ground; the faces (the public calls) on top.
FLOORS = [
    ("errors", "settings", "atomic", "progress", "tf_banners", "waiting_room", "ranking", "results", "faults",
     "frames", "tls", "user_code", "checks", "keras_helpers", "r_closure"),
    ("spark",),  # Spark's side: the cluster, the environments, the processes, the links, the barrier stage
    ("exchange",),  # how gradients travel
    ("data",),  # DataFrames to shards and back
    ("models",),  # the model as it travels, and what it needs in memory
    ("tracking",),  # MLflow
    ("fitting",),  # fit: the job, its driver side, the training loops over each exchange
    ("functions",),  # run and apply
    ("predicting",),  # predict
    ("api",), ("tuning",), ("ml",), ("__init__",),
]
# The one import that runs up, and why: the package's version lives in its face, where Python keeps it.
UPWARD_ALLOWED = {"tfbarrier.tracking.fit -> tfbarrier"}


def _room(module):
    """The room of a dotted tfbarrier module: its sub-package, or its own name at the top ("__init__": the face)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def upward_imports(sources):
    """Imports of ``sources`` (python/tfbarrier's paths) that run from a room to one on a floor above it."""
    modules = {_module_name(path): path for path in sources}
    floor = {room: level for level, rooms in enumerate(FLOORS) for room in rooms}
    unplaced = sorted({_room(name) for name in modules} - set(floor))
    assert unplaced == [], "rooms on no floor: place them in FLOORS (test_architecture.py) and ARCHITECTURE.md"
    return sorted(f"{name} -> {imported}" for name, path in modules.items()
                  for imported in _imports(path, name, modules)
                  if imported in modules and floor[_room(imported)] > floor[_room(name)])


def test_the_rooms_stack_in_floors_and_no_import_runs_up():
    package = [path for path in SOURCES if os.path.relpath(path, ROOT).startswith("python/")]
    assert upward_imports(package) == sorted(UPWARD_ALLOWED), "an import runs up a floor: move the code it needs down"
    text = _architecture()
    rows = re.findall(r"^\| \d+ \| ([^|]+) \|", text[text.index("## Floors"):text.index("## Rooms")], re.M)
    drawn = [re.findall(r"`(\w+)(?:/|\.py)?`", cell) for cell in rows]
    assert drawn == [list(rooms) for rooms in reversed(FLOORS)], "ARCHITECTURE.md's Floors are not FLOORS, top first"


def test_no_import_circle_anywhere_bench_included():
    modules = {_module_name(path): path for path in SOURCES}
    graph = {name: {imported for imported in _imports(path, name, modules) if imported in modules and imported != name}
             for name, path in modules.items()}
    circles, state = [], {}

    def visit(name, trail):
        state[name] = "open"
        for imported in sorted(graph[name]):
            if state.get(imported) == "open":
                circles.append(trail[trail.index(imported):] + [imported])
            elif imported not in state:
                visit(imported, trail + [imported])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert circles == [], "import circles"


def test_no_module_uses_another_modules_private_names():
    reached = []
    for path in SOURCES:
        with open(path) as f:
            tree = ast.parse(f.read())
        aliases = {alias.asname or alias.name.split(".")[-1] for node in ast.walk(tree)
                   if isinstance(node, (ast.Import, ast.ImportFrom))
                   and ((getattr(node, "module", None) or "").startswith("tfbarrier") or isinstance(node, ast.Import))
                   for alias in node.names if (alias.name.startswith("tfbarrier") or isinstance(node, ast.ImportFrom))}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tfbarrier"):
                reached += [f"{path}: from {node.module} import {a.name}" for a in node.names if _private(a.name)]
            elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                  and _private(node.attr)):
                reached.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}: {node.value.id}.{node.attr}")
    assert reached == [], "private names used from another module: make them public, or move the code"


def _private(name):
    return name.startswith("_") and not name.startswith("__")
