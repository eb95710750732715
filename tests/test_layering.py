"""Package layering: imports point down only, no import cycles, argv/exit/sys.path stay at the top.

Layers (a module may import its own layer or lower ones)::

    tsm_ds.utils, tsm_ds.config (0) <- tsm_ds.data (1) <- tsm_ds.models (2) <- tsm_ds.engine (3)
    <- tsm_ds.inference (4) <- tsm_ds.bench, tsm_ds.doctor, tsm_ds.experiments (5) <- tsm_ds.cli (6)
    <- tsm_ds, tsm_ds.train (7)

Inside layer 5, ``tsm_ds.bench`` imports neither ``tsm_ds.doctor`` nor ``tsm_ds.experiments`` (they
may use the benches).

The checker parses files only (``ast``; nothing is imported, no torch): every ``import`` and
``from ... import`` anywhere in a module (top level, functions, methods, ``if`` / ``try`` /
``TYPE_CHECKING`` blocks) plus ``importlib.import_module("literal")`` / ``__import__("literal")``.
Relative imports are resolved against the importing module's package; ``from pkg import name`` is
an import of ``pkg.name`` when that module or package exists on disk, else of ``pkg``;
``import a.b.c`` is an import of ``a.b.c`` (the parent packages that Python also runs are not
edges: every submodule would otherwise form a cycle with a package ``__init__`` that imports it).
Only modules of the package itself are graph nodes.

The checker functions take (root folder, package name, layer map), so the tests below run them on
the real tree and on small fixture packages written to ``tmp_path``.
"""
from __future__ import annotations

import ast
import functools
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "tsm_ds"

#: module-name prefix -> layer; a module's layer is that of its longest matching prefix
LAYERS: dict[str, int] = {"tsm_ds.utils": 0, "tsm_ds.config": 0, "tsm_ds.data": 1, "tsm_ds.models": 2,
                          "tsm_ds.engine": 3, "tsm_ds.inference": 4, "tsm_ds.bench": 5, "tsm_ds.doctor": 5,
                          "tsm_ds.experiments": 5,
                          "tsm_ds.cli": 6, "tsm_ds.train": 7, "tsm_ds": 7}
#: inside layer 5: the doctor and the experiments may use the benches, the benches use neither
BENCH_USERS = ("tsm_ds.doctor", "tsm_ds.experiments")
# may import argparse and exit the process; tsm_ds.config.fields is the parser generator (argparse parsers
# built from the configuration tree, used by the commands on the argv they hand it)
CLI_PREFIXES = ("tsm_ds.cli", "tsm_ds.train", "tsm_ds.config.fields")
SYS_PATH_MODULES = ("tsm_ds.train",)            # may edit sys.path


# ------------------------------------------------------------------------------------------------
# the checker (plain functions)


@dataclass(frozen=True)
class Edge:
    """``importer`` imports ``imported`` at ``file``:``line`` (kind: import / from / importlib)."""

    importer: str
    imported: str
    file: str
    line: int
    kind: str

    def where(self) -> str:
        return f"{self.file}:{self.line}"


def _under(name: str, prefixes: "str | tuple[str, ...]") -> bool:
    """``name`` is one of ``prefixes`` or inside one of them (dotted names)."""
    prefixes = (prefixes,) if isinstance(prefixes, str) else prefixes
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _rel(path: Path, root: Path) -> str:
    return Path(os.path.relpath(path, root)).as_posix()


def _parse(path: Path) -> ast.Module:
    st = path.stat()
    return _parse_cached(str(path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=4096)
def _parse_cached(path: str, mtime_ns: int, size: int) -> ast.Module:
    """Parsed once per file version (the tests walk the same tree several times)."""
    return ast.parse(Path(path).read_text(encoding="utf-8"), filename=path)


def _findings(items: list[tuple[str, int, str, str]]) -> list[str]:
    """(file, line, module, what) -> sorted ``file:line: module: what`` lines."""
    return [f"{f}:{ln}: {m}: {w}" for f, ln, m, w in sorted(items)]


def module_files(root: Path, package: str) -> dict[str, Path]:
    """Every ``.py`` file under ``root/package`` by dotted module name (``__init__`` -> the package)."""
    out: dict[str, Path] = {}
    for path in sorted((Path(root) / package).rglob("*.py")):
        rel = path.relative_to(root).with_suffix("")
        if "__pycache__" in rel.parts or not all(p.isidentifier() for p in rel.parts):
            continue
        out[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = path
    return out


def duplicate_modules(root: Path, package: str) -> list[str]:
    """Modules defined twice, as ``x.py`` and as a folder ``x/`` holding ``.py`` files: Python
    imports only one of them (the package with ``__init__.py``, else the ``.py`` file)."""
    out = []
    for path in sorted((Path(root) / package).rglob("*.py")):
        folder = path.with_suffix("")
        if path.name != "__init__.py" and folder.is_dir() and any(folder.rglob("*.py")):
            out.append(f"{_rel(path, root)} and {_rel(folder, root)}/ both define "
                       f"{'.'.join(path.relative_to(root).with_suffix('').parts)}")
    return out


def packages_without_init(root: Path, package: str) -> list[str]:
    """Folders under the package holding ``.py`` files but no ``__init__.py``: setuptools'
    ``find_packages`` skips them, so a wheel lacks their modules (a source checkout still works)."""
    base = Path(root) / package
    out = set()
    for folder in {p.parent for p in base.rglob("*.py") if "__pycache__" not in p.parts}:
        for f in [folder, *folder.parents]:
            if f == base.parent:
                break
            if not (f / "__init__.py").is_file():
                out.add(_rel(f, root) + "/")
    return sorted(out)


def _resolve_relative(module: str, is_pkg: bool, level: int, target: str | None) -> str | None:
    """``from <level dots><target> import ...`` inside ``module`` -> absolute name (None: above the top)."""
    parts = module.split(".") if is_pkg else module.split(".")[:-1]
    if level > len(parts):
        return None
    return ".".join(parts[:len(parts) - (level - 1)] + ([target] if target else []))


def module_imports(root: Path, package: str, module: str, path: Path, known: "set[str] | dict") -> list[Edge]:
    """Edges from ``module`` (file ``path``) to modules of ``package`` (see the module docstring)."""
    file, is_pkg, edges = _rel(path, root), path.name == "__init__.py", []

    def add(target: str, line: int, kind: str) -> None:
        if _under(target, package):
            edges.append(Edge(module, target, file, line, kind))

    for node in ast.walk(_parse(path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno, "import")
        elif isinstance(node, ast.ImportFrom):
            base = _resolve_relative(module, is_pkg, node.level, node.module) if node.level else node.module or ""
            if base is None:
                edges.append(Edge(module, "." * node.level + (node.module or ""), file, node.lineno,
                                  "relative import beyond the top-level package"))
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                add(sub if alias.name != "*" and sub in known else base, node.lineno, "from")
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            func = node.func
            if (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)) in (
                    "import_module", "__import__"):
                add(node.args[0].value, node.lineno, "importlib")
    return edges


def build_graph(root: Path, package: str) -> tuple[dict[str, Path], list[Edge]]:
    """(modules by name, every import edge between them or to missing modules of the package)."""
    modules = module_files(root, package)
    edges = [e for name, path in modules.items() for e in module_imports(root, package, name, path, modules)]
    return modules, sorted(set(edges), key=lambda e: (e.file, e.line, e.imported, e.kind))


def layer_of(module: str, layers: dict[str, int]) -> int | None:
    """Layer of the longest prefix of ``module`` in ``layers`` (None: no prefix matches)."""
    matches = [p for p in layers if _under(module, p)]
    return layers[max(matches, key=len)] if matches else None


def upward_imports(root: Path, package: str, layers: dict[str, int]) -> list[str]:
    """Each import from a lower layer to a higher one: ``file:line: importer (L) -> imported (L')``."""
    out = []
    for e in build_graph(root, package)[1]:
        lo, hi = layer_of(e.importer, layers), layer_of(e.imported, layers)
        if lo is not None and hi is not None and lo < hi:
            out.append(f"{e.where()}: {e.importer} (layer {lo}) -> {e.imported} (layer {hi})")
    return out


def unlayered_modules(root: Path, package: str, layers: dict[str, int]) -> list[str]:
    """Modules (or imported package modules) that no prefix of the layer map covers."""
    modules, edges = build_graph(root, package)
    names = sorted(set(modules) | {e.imported for e in edges if _under(e.imported, package)})
    return [f"{_rel(modules[m], root) if m in modules else '(imported)'}: {m}"
            for m in names if layer_of(m, layers) is None]


def missing_imports(root: Path, package: str) -> list[str]:
    """Imports of package modules that exist nowhere on disk (moved or deleted during a refactor)."""
    modules, edges = build_graph(root, package)
    return [f"{e.where()}: {e.importer} -> {e.imported} ({e.kind}): no such module on disk"
            for e in edges if e.imported not in modules]


def _reachable(start: str, succ: dict[str, set[str]]) -> set[str]:
    """Modules reachable from ``start`` in one or more imports."""
    seen: set[str] = set()
    todo = list(succ.get(start, ()))
    while todo:
        v = todo.pop()
        if v not in seen:
            seen.add(v)
            todo += succ.get(v, ())
    return seen


def _cycle_path(start: str, members: set[str], succ: dict[str, set[str]]) -> list[str]:
    """A shortest cycle [start, ..., start] inside ``members`` (breadth-first)."""
    prev: dict[str, str] = {}
    todo = [start]
    for v in todo:                                   # the list grows while it is walked
        for w in sorted(succ.get(v, ())):
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(prev[path[-1]])
                return [start] + path[::-1][1:] + [start]
            if w in members and w not in prev:
                prev[w] = v
                todo.append(w)
    return [start, start]


def import_cycles(root: Path, package: str, layers: dict[str, int] | None = None) -> list[dict]:
    """Import cycles: strongly connected components of size > 1 and self-imports.

    Returns:
        one dict per cycle: ``modules`` (the sorted component), ``cycle`` (a path [a, b, ..., a]) and
        ``edges`` (``file:line: importer -> imported`` for every import inside the component).
        ``layers`` is unused (the same signature as the other checks).
    """
    modules, edges = build_graph(root, package)
    succ: dict[str, set[str]] = {}
    for e in edges:
        if e.imported in modules:
            succ.setdefault(e.importer, set()).add(e.imported)
    reach = {m: _reachable(m, succ) for m in modules}
    out, done = [], set()
    for m in sorted(modules):
        if m in done or m not in reach[m]:
            continue
        comp = sorted(w for w in reach[m] if m in reach[w])      # contains m: it lies on a cycle
        done.update(comp)
        inner = sorted({f"{e.where()}: {e.importer} -> {e.imported}" for e in edges
                        if e.importer in comp and e.imported in comp})
        out.append({"modules": comp, "cycle": _cycle_path(m, set(comp), succ), "edges": inner})
    return out


def format_cycles(cycles: list[dict]) -> str:
    return "\n".join(" -> ".join(c["cycle"]) + "\n    " + "\n    ".join(c["edges"]) for c in cycles)


def cli_only_violations(root: Path, package: str, allowed: tuple[str, ...] = CLI_PREFIXES) -> list[str]:
    """Modules outside ``allowed`` that import argparse or exit the process: ``sys.exit(...)`` (also
    through ``import sys as s`` / ``from sys import exit``), ``raise SystemExit``, ``os._exit(...)``,
    the builtins ``exit()`` / ``quit()``. Lines ``file:line: module: what``."""
    out = []
    for module, path in module_files(root, package).items():
        if _under(module, allowed):
            continue
        tree, file = _parse(path), _rel(path, root)
        sys_names, os_names, exit_names = {"sys"}, {"os"}, {"exit", "quit"}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                sys_names |= {a.asname or "sys" for a in node.names if a.name == "sys"}
                os_names |= {a.asname or "os" for a in node.names if a.name == "os"}
            elif isinstance(node, ast.ImportFrom) and node.module == "sys" and not node.level:
                exit_names |= {a.asname or a.name for a in node.names if a.name == "exit"}

        def hit(node: ast.AST, what: str) -> None:
            out.append((file, node.lineno, module, what))

        for node in ast.walk(tree):
            if isinstance(node, ast.Import) and any(_under(a.name, "argparse") for a in node.names):
                hit(node, "imports argparse")
            elif isinstance(node, ast.ImportFrom) and not node.level and _under(node.module or "", "argparse"):
                hit(node, "imports from argparse")
            elif isinstance(node, ast.Call):
                f = node.func
                if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
                    if f.attr == "exit" and f.value.id in sys_names:
                        hit(node, f"calls {f.value.id}.exit")
                    elif f.attr == "_exit" and f.value.id in os_names:
                        hit(node, f"calls {f.value.id}._exit")
                elif isinstance(f, ast.Name) and f.id in exit_names:
                    hit(node, f"calls {f.id}()")
            elif isinstance(node, ast.Raise) and node.exc is not None:
                exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                if isinstance(exc, ast.Name) and exc.id == "SystemExit":
                    hit(node, "raises SystemExit")
    return _findings(out)


_SYS_PATH_METHODS = {"insert", "append", "extend", "remove", "pop", "clear", "reverse", "sort",
                     "__setitem__", "__delitem__", "__iadd__"}


def sys_path_violations(root: Path, package: str, allowed: tuple[str, ...] = SYS_PATH_MODULES) -> list[str]:
    """Modules outside ``allowed`` that assign to or mutate ``sys.path`` (or call site.addsitedir)."""
    out = []
    for module, path in module_files(root, package).items():
        if _under(module, allowed):
            continue
        tree, file = _parse(path), _rel(path, root)
        sys_names, path_names = {"sys"}, set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                sys_names |= {a.asname or "sys" for a in node.names if a.name == "sys"}
            elif isinstance(node, ast.ImportFrom) and node.module == "sys" and not node.level:
                path_names |= {a.asname or a.name for a in node.names if a.name == "path"}

        def is_sys_path(n: ast.AST) -> bool:
            while isinstance(n, (ast.Subscript, ast.Starred)):
                n = n.value
            return (isinstance(n, ast.Attribute) and n.attr == "path" and isinstance(n.value, ast.Name)
                    and n.value.id in sys_names) or (isinstance(n, ast.Name) and n.id in path_names)

        for node in ast.walk(tree):
            targets: list[ast.AST] = []
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    targets += t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            elif isinstance(node, ast.Delete):
                targets = list(node.targets)
            if any(is_sys_path(t) for t in targets):
                out.append((file, node.lineno, module, "assigns to sys.path"))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                f = node.func
                if f.attr in _SYS_PATH_METHODS and is_sys_path(f.value):
                    out.append((file, node.lineno, module, f"calls sys.path.{f.attr}"))
                elif f.attr == "addsitedir" and isinstance(f.value, ast.Name) and f.value.id == "site":
                    out.append((file, node.lineno, module, "calls site.addsitedir"))
    return _findings(out)


# ------------------------------------------------------------------------------------------------
# the real tree


def _fail(title: str, lines: list[str]) -> None:
    if lines:
        pytest.fail(f"{title} ({len(lines)}):\n  " + "\n  ".join(lines), pytrace=False)


def test_tree_has_the_layout():
    modules = module_files(REPO, PACKAGE)
    assert PACKAGE in modules and f"{PACKAGE}.train" in modules
    root_imports = [n.lineno for n in ast.walk(_parse(modules[PACKAGE]))
                    if isinstance(n, (ast.Import, ast.ImportFrom)) and getattr(n, "module", None) != "__future__"]
    assert not root_imports, f"tsm_ds/__init__.py must import nothing; imports at lines {root_imports}"
    _fail("modules in no layer (add them to a layer package)", unlayered_modules(REPO, PACKAGE, LAYERS))


def test_no_module_defined_twice():
    _fail("a module file and a package folder of the same name", duplicate_modules(REPO, PACKAGE))


def test_no_upward_imports():
    _fail("imports from a lower layer to a higher one", upward_imports(REPO, PACKAGE, LAYERS))


def test_bench_imports_neither_the_doctor_nor_the_experiments():
    edges = build_graph(REPO, PACKAGE)[1]
    _fail("imports from tsm_ds.bench of the modules that use it",
          [f"{e.where()}: {e.importer} -> {e.imported}" for e in edges
           if _under(e.importer, "tsm_ds.bench") and _under(e.imported, BENCH_USERS)])


def test_no_import_cycles():
    cycles = import_cycles(REPO, PACKAGE, LAYERS)
    if cycles:
        pytest.fail(f"import cycles ({len(cycles)}):\n" + format_cycles(cycles), pytrace=False)


def test_every_package_import_exists():
    _fail("imports of package modules that do not exist", missing_imports(REPO, PACKAGE))


def test_every_package_folder_has_init():
    _fail("package folders without __init__.py (left out of the wheel by find_packages)",
          packages_without_init(REPO, PACKAGE))


def test_argparse_and_exit_only_in_cli():
    _fail("argparse / process exit outside tsm_ds/cli/ and tsm_ds/train.py", cli_only_violations(REPO, PACKAGE))


def test_only_the_train_shim_edits_sys_path():
    _fail("sys.path edited outside tsm_ds/train.py", sys_path_violations(REPO, PACKAGE))
    edits = sys_path_violations(REPO, PACKAGE, allowed=())      # the checker sees the shim's own edits
    assert edits and all(e.startswith("tsm_ds/train.py:") for e in edits), edits


# ------------------------------------------------------------------------------------------------
# the checker on planted fixtures

FIX_LAYERS = {"pkg.low": 0, "pkg.high": 1, "pkg": 2}


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
    return root


def _clean_files() -> dict[str, str]:
    return {
        "pkg/__init__.py": '"""root"""\n',
        "pkg/low/__init__.py": "from .a import f\n",
        "pkg/low/a.py": "import os\n\ndef f():\n    from pkg.low import b\n    return b.g()\n",
        "pkg/low/b.py": "def g():\n    return 1\n",
        "pkg/high/__init__.py": "",
        "pkg/high/c.py": ("from ..low import a\nfrom pkg.low.b import g\nimport pkg.low\n\n"
                          "class C:\n    def m(self):\n        if True:\n            from . import d\n"),
        "pkg/high/d.py": "from pkg.low import a, b\n",
        "pkg/cli.py": "import argparse\nimport sys\nimport pkg.high.c\n\ndef main():\n    sys.exit(0)\n",
    }


def test_checker_passes_a_clean_fixture(tmp_path):
    root = _write(tmp_path, _clean_files())
    modules, edges = build_graph(root, "pkg")
    assert set(modules) == {"pkg", "pkg.low", "pkg.low.a", "pkg.low.b", "pkg.high", "pkg.high.c", "pkg.high.d",
                            "pkg.cli"}
    got = {(e.importer, e.imported) for e in edges}
    assert got == {("pkg.low", "pkg.low.a"), ("pkg.low.a", "pkg.low.b"), ("pkg.high.c", "pkg.low.a"),
                   ("pkg.high.c", "pkg.low.b"), ("pkg.high.c", "pkg.low"), ("pkg.high.c", "pkg.high.d"),
                   ("pkg.high.d", "pkg.low.a"), ("pkg.high.d", "pkg.low.b"), ("pkg.cli", "pkg.high.c")}
    assert upward_imports(root, "pkg", FIX_LAYERS) == import_cycles(root, "pkg", FIX_LAYERS) == []
    assert missing_imports(root, "pkg") == unlayered_modules(root, "pkg", FIX_LAYERS) == []
    assert cli_only_violations(root, "pkg", allowed=("pkg.cli",)) == sys_path_violations(root, "pkg", ()) == []
    assert packages_without_init(root, "pkg") == duplicate_modules(root, "pkg") == []


def test_checker_finds_a_cycle_through_function_level_imports(tmp_path):
    files = _clean_files()
    files["pkg/low/a.py"] = "def f():\n    from pkg.low import b\n    return b.g()\n"
    files["pkg/low/b.py"] = "def g():\n    from . import a\n    return a\n"
    files["pkg/high/d.py"] = "def h():\n    import pkg.high.d\n"          # a self-import
    root = _write(tmp_path, files)
    cycles = import_cycles(root, "pkg", FIX_LAYERS)
    assert [c["modules"] for c in cycles] == [["pkg.high.d"], ["pkg.low.a", "pkg.low.b"]]
    by_first = {c["modules"][0]: c for c in cycles}
    assert by_first["pkg.low.a"]["cycle"] == ["pkg.low.a", "pkg.low.b", "pkg.low.a"]
    assert by_first["pkg.low.a"]["edges"] == ["pkg/low/a.py:2: pkg.low.a -> pkg.low.b",
                                              "pkg/low/b.py:2: pkg.low.b -> pkg.low.a"]
    assert by_first["pkg.high.d"]["cycle"] == ["pkg.high.d", "pkg.high.d"]
    assert "pkg.low.a -> pkg.low.b -> pkg.low.a" in format_cycles(cycles)
    assert upward_imports(root, "pkg", FIX_LAYERS) == []


def test_checker_finds_a_cycle_through_a_package_init(tmp_path):
    files = _clean_files()
    files["pkg/low/b.py"] = "def g():\n    from pkg.low import f\n    return f\n"   # pkg.low imports a
    root = _write(tmp_path, files)
    (cyc,) = import_cycles(root, "pkg", FIX_LAYERS)
    assert cyc["modules"] == ["pkg.low", "pkg.low.a", "pkg.low.b"]
    assert "pkg/low/b.py:2: pkg.low.b -> pkg.low" in cyc["edges"]


def test_checker_finds_an_upward_import_inside_a_function(tmp_path):
    files = _clean_files()
    files["pkg/low/b.py"] = ("def g():\n    return 1\n\n\nclass K:\n    def m(self):\n"
                             "        try:\n            from ..high.c import C\n        except ImportError:\n"
                             "            pass\n")
    files["pkg/low/a.py"] = "import importlib\n\ndef f():\n    return importlib.import_module('pkg.cli')\n"
    root = _write(tmp_path, files)
    assert upward_imports(root, "pkg", FIX_LAYERS) == [
        "pkg/low/a.py:4: pkg.low.a (layer 0) -> pkg.cli (layer 2)",
        "pkg/low/b.py:8: pkg.low.b (layer 0) -> pkg.high.c (layer 1)",
    ]
    assert import_cycles(root, "pkg", FIX_LAYERS) != []       # pkg.low.b -> pkg.high.c -> pkg.low.b too


def test_checker_finds_cli_rules_missing_modules_and_missing_inits(tmp_path):
    files = _clean_files()
    files["pkg/low/a.py"] = ("import sys as _s\nfrom argparse import ArgumentParser\n\n"
                             "def f():\n    raise SystemExit(2)\n\ndef g():\n    _s.exit(1)\n")
    files["pkg/low/b.py"] = ("import sys\nfrom sys import path as P\n\nsys.path.insert(0, 'x')\n"
                             "sys.path[:] = []\nP.append('y')\nimport pkg.low.gone\n")
    files["pkg/extra/e.py"] = "from pkg.high import nothing_here\n"
    root = _write(tmp_path, files)
    assert cli_only_violations(root, "pkg", allowed=("pkg.cli",)) == [
        "pkg/low/a.py:2: pkg.low.a: imports from argparse",
        "pkg/low/a.py:5: pkg.low.a: raises SystemExit",
        "pkg/low/a.py:8: pkg.low.a: calls _s.exit",
    ]
    assert sys_path_violations(root, "pkg", allowed=()) == [
        "pkg/low/b.py:4: pkg.low.b: calls sys.path.insert",
        "pkg/low/b.py:5: pkg.low.b: assigns to sys.path",
        "pkg/low/b.py:6: pkg.low.b: calls sys.path.append",
    ]
    assert missing_imports(root, "pkg") == [
        "pkg/low/b.py:7: pkg.low.b -> pkg.low.gone (import): no such module on disk"]
    assert packages_without_init(root, "pkg") == ["pkg/extra/"]
    _write(root, {"pkg/high/c/x.py": ""})
    assert duplicate_modules(root, "pkg") == ["pkg/high/c.py and pkg/high/c/ both define pkg.high.c"]
    assert unlayered_modules(root, "pkg", {"pkg.low": 0, "pkg.high": 1}) == [
        "pkg/__init__.py: pkg", "pkg/cli.py: pkg.cli", "pkg/extra/e.py: pkg.extra.e"]
