"""The layout's rules (docs/design.md), kept by reading the source: imports point down the layers,
no import circles (a package's ``__init__`` counted: importing ``a.b.c`` runs ``a.b``), no module
over 500 lines and no function over 60, no dates or commit hashes in code (the exceptions listed
here, each with its reason)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# bottom to top: a room imports only its own modules and the rooms below it
LAYERS = ("common", "drafters", "decoding", "workers", "orchestrator", "experiments")
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60
# entry points (`__main__` modules) follow the same rule: `python -m drafters` runs drafters' commands,
# `python -m workers train` the one that launches Ray Train
# circles known and why each stays (sorted modules -> reason); the test fails on any other circle and
# on a listed one that is gone
KNOWN_CIRCLES: dict[tuple[str, ...], str] = {
}
LONG_FUNCTIONS: dict[str, str] = {  # "module:function" -> why it stays longer than 60 lines
}


def _modules() -> dict[str, Path]:
    out = {}
    for room in LAYERS:
        for path in sorted((ROOT / room).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports, at module level or inside functions."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in modules:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def _with_packages(name: str, targets: set[str], modules: dict[str, Path]) -> set[str]:
    """``targets`` and the packages importing them runs (``a.b`` for ``a.b.c``), less ``name``'s own
    packages (already run when ``name`` runs)."""
    own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 2)}
    parents = {".".join(t.split(".")[:i]) for t in targets for i in range(1, t.count(".") + 1)}
    return targets | {p for p in parents if p in modules and p not in own}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _with_packages(name, _imports(name, path, modules), modules)
            for name, path in modules.items()}


def test_imports_point_down_the_layers():
    rank = {room: i for i, room in enumerate(LAYERS)}
    up = [f"{a} -> {b}" for a, targets in _graph().items() for b in sorted(targets)
          if rank[b.split(".")[0]] > rank[a.split(".")[0]]]
    assert not up, "imports pointing up a layer:\n" + "\n".join(sorted(up))


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(root: str) -> None:
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    circles = {tuple(c) for c in _circles(_graph())}
    new = sorted(circles - set(KNOWN_CIRCLES))
    assert not new, "import circles:\n" + "\n".join(" <-> ".join(c) for c in new)
    gone = sorted(set(KNOWN_CIRCLES) - circles)
    assert not gone, f"KNOWN_CIRCLES lists circles that are gone (drop them): {gone}"


def test_the_circle_finder_finds_one():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_a_package_init_is_in_the_graph():
    """``x.m`` importing ``x.p.q`` runs ``x.p``'s ``__init__``: the circle through it is found."""
    modules = dict.fromkeys(["x", "x.m", "x.p", "x.p.q", "x.p.load"], Path())
    graph = {"x.m": {"x.p.q"}, "x.p": {"x.p.load", "x.p.q"}, "x.p.load": {"x.m", "x.p.q"}, "x.p.q": set()}
    graph = {n: _with_packages(n, t, modules) for n, t in graph.items()}
    assert graph["x.m"] == {"x.p.q", "x.p"} and graph["x.p.load"] == {"x.m", "x.p.q"}
    assert _circles(graph) == [["x.m", "x.p", "x.p.load"]]


def test_no_module_over_500_lines():
    long = {n: len(p.read_text().splitlines()) for n, p in _modules().items()}
    over = {n: lines for n, lines in long.items() if lines > MAX_MODULE_LINES}
    assert not over, f"modules over {MAX_MODULE_LINES} lines: {over}"


def test_no_function_over_60_lines():
    over = {}
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                where = f"{name}:{node.name}"
                if lines > MAX_FUNCTION_LINES and where not in LONG_FUNCTIONS:
                    over[where] = lines
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines (split, or list with a reason): {over}"
    modules = _modules()
    stale = [w for w in LONG_FUNCTIONS if w.partition(":")[0] not in modules]
    assert not stale, f"LONG_FUNCTIONS names modules that are gone: {stale}"



def _packed(tree: ast.AST) -> list[int]:
    """Lines of assignments that pack three or more values into one tuple (``a, b, c = x, y, z``)."""
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Assign) and len(n.targets) == 1
            and isinstance(n.targets[0], ast.Tuple) and isinstance(n.value, ast.Tuple)
            and len(n.value.elts) >= 3]


def test_one_value_per_assignment():
    """Three or more values packed into one tuple read as a way around the function limit: one per line
    (unpacking a function's result, ``a, b, c = f()``, is not packing)."""
    packed = {name: lines for name, path in _modules().items()
              if (lines := _packed(ast.parse(path.read_text())))}
    assert not packed, f"assignments packing 3+ values (one per line): {packed}"
    assert _packed(ast.parse("a, b, c = 1, 2, 3\nd, e = 1, 2\nf, g, h = t")) == [1]

# a date, or a commit hash (7-40 hex digits, at least one letter and one digit)
DATED = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b|\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b")


def test_no_dated_measurements_in_code():
    """Measurements name their date, commit and machine, and live in docs/ (docs/performance.md):
    a date or a commit hash in a module is a measurement (or a history) that moved into code. Tests
    and their fixtures (tests/, not read here) keep the commits they load on purpose."""
    dated = [f"{name}:{i}: {m.group()}" for name, path in _modules().items()
             for i, line in enumerate(path.read_text().splitlines(), 1) for m in DATED.finditer(line)]
    assert not dated, f"dates or commit hashes in code (move them to docs/): {dated}"


def test_the_date_rule_finds_dates_and_commit_hashes():
    hits = [bool(DATED.search(t)) for t in ("at 7b1ea68", "on 2026-12-07", "sha 0123abcdef4567",
                                             "deadbeef", "1234567", "a 64-hex " + "ab12" * 16, "float16")]
    assert hits == [True, True, True, False, False, False, False]


def test_the_design_page_lists_every_module_once():
    """docs/design.md has one line per module (a table row naming its path), and no module that is gone."""
    listed = re.findall(r"^\| `([\w/]+\.py)` \|", (ROOT / "docs" / "design.md").read_text(), re.M)
    paths = {str(p.relative_to(ROOT)) for p in _modules().values()}
    assert sorted(set(listed)) == sorted(listed), "a module listed twice"
    assert not paths - set(listed), f"modules missing from docs/design.md: {sorted(paths - set(listed))}"
    gone = sorted(set(listed) - paths)
    assert not gone, f"docs/design.md lists modules that are gone: {gone}"
