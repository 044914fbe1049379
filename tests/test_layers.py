"""The package's layering, read from the source: forbidden imports and private reaches.

Every module under ``rocketspark/`` (and ``pyspark_rocketmq.py``) is parsed with ``ast``
and all its imports are collected: top-level ones, those inside functions (lazy imports),
those under ``if TYPE_CHECKING:``, ``importlib.import_module("...")`` with a literal
name, and the lazily exported names of a package's ``_EXPORTS`` table (name -> module, as
in ``rocketspark/store/__init__.py``). A ``from package import name`` where ``name`` is in
that package's ``_EXPORTS`` also counts as an import of the module that defines it.

Imports under ``TYPE_CHECKING`` count like any other: a type-only import still ties the
importer's interface to the imported layer (its signatures name that layer's types), and
the layout forbids the dependency, not only its run-time cost. A module that needs a type
from a layer it may not import takes a protocol or a value from a lower layer instead.

The rules (dependencies point downward only: message < store < client < datasource) are
in ``FORBIDDEN``; a rule about a package that does not exist yet (``remoting``,
``client``) holds vacuously until it does. ``KNOWN_EDGES`` and ``KNOWN_REACHES`` list
the violations that exist today and are being removed by the layout work: delete an
entry when its edge is gone (a stale entry fails the test too, so the lists only shrink).

Private reaches: a module may use its own ``_names`` freely, but not another module's.
The test flags ``from rocketspark.x import _name`` across modules, ``module._name`` where
``module`` is one of our modules, and ``obj._name`` where ``obj`` is not ``self``/``cls``/
``super()`` and ``_name`` is not defined in the module doing the access (so code that
handles another instance of its own class, as ``__eq__`` does, is not a reach).
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "rocketspark"
THIRD_PARTY_SPARK = ("pyspark", "delta")


def _module_files() -> dict[str, Path]:
    files = {"pyspark_rocketmq": ROOT / "pyspark_rocketmq.py"}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        files[".".join(parts)] = path
    return files


MODULES = _module_files()
PACKAGES = {name for name, path in MODULES.items() if path.name == "__init__.py"}


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _ours(module: str) -> bool:
    return _within(module, PACKAGE) or module == "pyspark_rocketmq"


# --- collecting imports ---------------------------------------------------------------


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    path: str
    line: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.source} -> {self.target}"


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _exports(tree: ast.Module) -> dict[str, tuple[str, int]]:
    """A module-level ``_EXPORTS = {"Name": "module", ...}``: name -> (module, line)."""
    out: dict[str, tuple[str, int]] = {}
    for node in tree.body:
        target = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        if not (isinstance(target, ast.Name) and target.id == "_EXPORTS"):
            continue
        assert isinstance(value, ast.Dict), "_EXPORTS must be a dict literal"
        for key, val in zip(value.keys, value.values, strict=True):
            assert isinstance(key, ast.Constant) and isinstance(val, ast.Constant)
            out[key.value] = (val.value, val.lineno)
    return out


EXPORTS = {name: _exports(_parse(MODULES[name])) for name in PACKAGES}


def _resolve_from(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module if module in PACKAGES else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def _targets_of_from(base: str, names: list[str]) -> Iterator[str]:
    """The modules a ``from base import names`` depends on.

    ``base`` itself only when a name is defined there (not for submodules: like
    ``import a.b``, importing a submodule is not counted as importing its package).
    """
    attribute = False
    for name in names:
        if f"{base}.{name}" in MODULES:
            yield f"{base}.{name}"
        else:
            attribute = True
            if name in EXPORTS.get(base, {}):
                yield EXPORTS[base][name][0]
    if attribute:
        yield base


def imports(module: str, tree: ast.Module | None = None) -> list[Edge]:
    path = MODULES[module]
    rel = _rel(path)
    tree = tree or _parse(path)
    edges: list[Edge] = []

    def add(target: str, line: int) -> None:
        if target and target != module:
            edges.append(Edge(module, target, rel, line))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve_from(module, node)
            for target in _targets_of_from(base, [a.name for a in node.names]):
                add(target, node.lineno)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and (getattr(node.func, "attr", None) or getattr(node.func, "id", None))
            == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            add(node.args[0].value, node.lineno)
    for target, line in EXPORTS.get(module, {}).values():
        add(target, line)
    return edges


ALL_EDGES = [edge for module in MODULES for edge in imports(module)]


# --- the rules ------------------------------------------------------------------------

_S = f"{PACKAGE}.store"
_M = f"{PACKAGE}.message"
_DS = f"{PACKAGE}.datasource"
_DL = f"{PACKAGE}.deadletter"
_R = f"{PACKAGE}.remoting"
_E = f"{PACKAGE}.errors"
_FACADE = f"{_S}.message_store"


def _store_rule(edge: Edge) -> bool:
    upward = ("client", "remoting", "datasource", "deadletter", "cli", "session")
    return _within(edge.source, _S) and (
        any(_within(edge.target, f"{PACKAGE}.{name}") for name in upward)
        or any(_within(edge.target, name) for name in THIRD_PARTY_SPARK)
    )


def _message_rule(edge: Edge) -> bool:
    return (
        _within(edge.source, _M)
        and _ours(edge.target)
        and not (_within(edge.target, _M) or _within(edge.target, _E))
    )


def _datasource_rule(edge: Edge) -> bool:
    return _within(edge.source, _DS) and (_within(edge.target, _S) or _within(edge.target, _R))


def _deadletter_rule(edge: Edge) -> bool:
    return _within(edge.source, _DL) and (_within(edge.target, _S) or _within(edge.target, _R))


def _remoting_rule(edge: Edge) -> bool:
    # The protocol stands on message and errors only; the processors package (the server's
    # requests served over a MessageStore: namesrv, send, pull, pull_hold, transaction,
    # clients, consumer_offsets, queue_locks, admin, broker, served) is the one place that
    # may add the store: the server itself is transport only.
    if not _within(edge.source, _R):
        return False
    allowed = [_R, _M, _E]
    if _within(edge.source, f"{_R}.processors"):
        allowed.append(_S)
    ours = _ours(edge.target) and not any(_within(edge.target, name) for name in allowed)
    return ours or any(_within(edge.target, name) for name in THIRD_PARTY_SPARK)


def _client_rule(edge: Edge) -> bool:
    # Only a backend module may reach what it wraps (the store now, the protocol later);
    # nothing in client/ reaches up to the Spark side.
    # The remote backend is client/remote.py and its parts, client/remote_*.py.
    backend = edge.source == f"{PACKAGE}.client.embedded" or (
        edge.source == f"{PACKAGE}.client.remote"
        or edge.source.startswith(f"{PACKAGE}.client.remote_")
    )
    within = _within(edge.source, f"{PACKAGE}.client")
    down = _within(edge.target, _S) or _within(edge.target, _R)
    up = _within(edge.target, _DS) or _within(edge.target, _DL)
    return within and (up or (down and not backend))


def _facade_rule(edge: Edge) -> bool:
    # The package's lazy exports (and their TYPE_CHECKING twins) may name the facade.
    return _within(edge.source, _S) and edge.source != _S and _within(edge.target, _FACADE)


def _errors_rule(edge: Edge) -> bool:
    return _within(edge.source, _E) and _ours(edge.target)


FORBIDDEN = {
    "store imports client/remoting/datasource/deadletter/cli/session/pyspark/delta": _store_rule,
    "message imports ours other than message and errors": _message_rule,
    "datasource imports store or remoting": _datasource_rule,
    "deadletter imports store or remoting": _deadletter_rule,
    "remoting imports ours other than remoting, message and errors (processors/*: + store),"
    " or pyspark/delta": _remoting_rule,
    "client (outside its backends) imports store or remoting, or the Spark side": _client_rule,
    "a store module imports the message_store facade": _facade_rule,
    "errors imports ours": _errors_rule,
}

# Forbidden edges that exist today, as (importing file, imported module): each is
# removed by the layout work; delete the entry when it goes.
KNOWN_EDGES: frozenset[tuple[str, str]] = frozenset()


def violations() -> dict[tuple[str, str], list[str]]:
    found: dict[tuple[str, str], list[str]] = {}
    for edge in ALL_EDGES:
        for rule, broken in FORBIDDEN.items():
            if broken(edge):
                found.setdefault((edge.path, edge.target), []).append(f"{edge}  [{rule}]")
    return found


def test_the_modules_are_found() -> None:
    assert f"{_S}.message_store" in MODULES
    assert f"{_M}.record" in MODULES
    assert "pyspark_rocketmq" in MODULES
    assert _S in EXPORTS and EXPORTS[_S], "rocketspark/store/__init__.py's _EXPORTS table"


def test_no_forbidden_imports() -> None:
    found = violations()
    new = sorted(line for key, lines in found.items() if key not in KNOWN_EDGES for line in lines)
    assert not new, "forbidden imports:\n" + "\n".join(new)


def test_known_edges_are_still_there() -> None:
    """An entry of KNOWN_EDGES whose edge is gone must be deleted (the list only shrinks)."""
    stale = sorted(KNOWN_EDGES - violations().keys())
    assert not stale, "delete these KNOWN_EDGES entries, the edges are gone:\n" + "\n".join(
        f"{path} -> {target}" for path, target in stale
    )


# --- private reaches ------------------------------------------------------------------

# Public API that happens to start with an underscore (namedtuple's methods).
_PUBLIC_UNDERSCORED = frozenset({"_replace", "_asdict", "_fields", "_make", "_field_defaults"})


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


@dataclass(frozen=True)
class Reach:
    path: str
    line: int
    name: str
    how: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.how}"


def _own_private_names(tree: ast.Module) -> set[str]:
    """The ``_names`` this module defines: its functions, classes, variables, arguments,
    attributes it assigns (``self._x = ...``) and ``__slots__`` entries."""
    own: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            own.add(node.name)
        elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            own.add(node.id)
        elif isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Load):
            own.add(node.attr)
        elif isinstance(node, ast.arg):
            own.add(node.arg)
        elif isinstance(node, ast.alias):
            own.add(node.asname or node.name.partition(".")[0])
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets
        ):
            for const in ast.walk(node.value):
                if isinstance(const, ast.Constant) and isinstance(const.value, str):
                    own.add(const.value)
    return {name for name in own if _private(name)}


def _module_aliases(module: str, tree: ast.Module) -> tuple[dict[str, str], set[str]]:
    """Names bound by imports: to our modules (name -> module), and to anything else."""
    ours: dict[str, str] = {}
    foreign: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound = alias.asname or alias.name.partition(".")[0]
                target = alias.name if alias.asname else alias.name.partition(".")[0]
                if _ours(target):
                    ours[bound] = target
                else:
                    foreign.add(bound)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve_from(module, node)
            for alias in node.names:
                bound = alias.asname or alias.name
                if f"{base}.{alias.name}" in MODULES:
                    ours[bound] = f"{base}.{alias.name}"
                elif not _ours(base):
                    foreign.add(bound)
    return ours, foreign


def _dotted(node: ast.expr) -> list[str] | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return parts[::-1]


def private_reaches(module: str, tree: ast.Module | None = None) -> list[Reach]:
    path = MODULES[module]
    rel = _rel(path)
    tree = tree or _parse(path)
    own = _own_private_names(tree)
    ours, foreign = _module_aliases(module, tree)
    package = module if module in PACKAGES else module.rpartition(".")[0]
    found: list[Reach] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = _resolve_from(module, node)
            if not _ours(base) or base == module:
                continue
            for alias in node.names:
                name = alias.name
                if not _private(name):
                    continue
                if f"{base}.{name}" in MODULES and base == package:
                    continue  # a private module of the importer's own package
                how = f"from {base} import {name}"
                found.append(Reach(rel, node.lineno, f"{base}.{name}", how))
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Load)
            and _private(node.attr)
            and node.attr not in _PUBLIC_UNDERSCORED
        ):
            receiver = node.value
            dotted = _dotted(receiver)
            if dotted is not None and dotted[0] in ours:
                # module._name, or package.module._name
                target = ours[dotted[0]]
                for part in dotted[1:]:
                    if f"{target}.{part}" not in MODULES:
                        target = ""
                        break
                    target = f"{target}.{part}"
                if target and target != module:
                    how = f"{'.'.join(dotted)}.{node.attr} (module {target})"
                    found.append(Reach(rel, node.lineno, f"{target}.{node.attr}", how))
                    continue
            if isinstance(receiver, ast.Name) and receiver.id in ("self", "cls"):
                continue
            if (
                isinstance(receiver, ast.Call)
                and isinstance(receiver.func, ast.Name)
                and receiver.func.id == "super"
            ):
                continue
            if dotted is not None and dotted[0] in foreign:
                continue  # another library's business (sys._getframe, os._exit)
            if node.attr in own:
                continue  # this module's own private name, on another object
            text = ast.unparse(node)
            found.append(Reach(rel, node.lineno, node.attr, text))
    return found


ALL_REACHES = [reach for module in MODULES for reach in private_reaches(module)]

# Private reaches that exist today, as (file, name reached): ``_name`` on another
# module's object, or the dotted ``module._name`` for a module or an import.
# Delete an entry when its reach is gone.
KNOWN_REACHES: frozenset[tuple[str, str]] = frozenset({})


def test_no_private_reaches() -> None:
    new = sorted(str(r) for r in ALL_REACHES if (r.path, r.name) not in KNOWN_REACHES)
    assert not new, "reaches into another module's private names:\n" + "\n".join(new)


def test_known_reaches_are_still_there() -> None:
    """An entry of KNOWN_REACHES whose reach is gone must be deleted (the list only shrinks)."""
    stale = sorted(KNOWN_REACHES - {(r.path, r.name) for r in ALL_REACHES})
    assert not stale, "delete these KNOWN_REACHES entries, the reaches are gone:\n" + "\n".join(
        f"{path}: {name}" for path, name in stale
    )


# --- the checker itself ---------------------------------------------------------------


def _check_source(source: str) -> tuple[list[Edge], list[Reach]]:
    """Run the collectors over ``source`` as if it were a module of rocketspark/store/."""
    module = f"{_S}.zz_layers_probe"
    MODULES[module] = ROOT / PACKAGE / "store" / "zz_layers_probe.py"
    try:
        tree = ast.parse(textwrap.dedent(source))
        return imports(module, tree), private_reaches(module, tree)
    finally:
        del MODULES[module]


def test_the_checker_sees_lazy_and_type_only_imports() -> None:
    edges, _ = _check_source(
        """
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from rocketspark.datasource import source
        def later():
            import rocketspark.cli
            from rocketspark.store import MessageStore
            import importlib
            importlib.import_module("rocketspark.session")
        """,
    )
    targets = {edge.target for edge in edges}
    assert {
        f"{_DS}.source",
        f"{PACKAGE}.cli",
        f"{PACKAGE}.session",
        _FACADE,  # through the package's _EXPORTS
    } <= targets
    broken = {rule for edge in edges for rule, test in FORBIDDEN.items() if test(edge)}
    assert len(broken) == 2, broken  # store upward, and the facade


def test_the_checker_sees_private_reaches() -> None:
    _, reaches = _check_source(
        """
        import sys
        from rocketspark.store import commit_log
        from rocketspark.store.config import _read_properties
        import rocketspark.store.mapped_file as mf
        class Mine:
            def __init__(self, other):
                self._own = 1
                self._other = other
            def __eq__(self, other):
                return self._own == other._own          # our own name: fine
            def go(self, store):
                sys._getframe()                          # another library's: fine
                super()._base()                          # our base class: fine
                store._cq                                # a reach
                self._other._write_lock                  # a reach
                commit_log._MAGIC_LAST                   # a module's private
                return mf._write_zeros
        """,
    )
    assert sorted(r.name for r in reaches) == sorted(
        [
            "rocketspark.store.config._read_properties",
            "_cq",
            "_write_lock",
            f"{_S}.commit_log._MAGIC_LAST",
            f"{_S}.mapped_file._write_zeros",
        ]
    )


def test_the_remoting_rule() -> None:
    def edge(source: str, target: str) -> Edge:
        return Edge(f"{_R}.{source}", target, "rocketspark/remoting/x.py", 1)

    for target in (f"{_S}.commit_log", f"{PACKAGE}.client", _DS, "pyspark.sql", f"{PACKAGE}.cli"):
        assert _remoting_rule(edge("connection", target)), target
    for target in (_E, f"{_M}.record", f"{_R}.codes", "socket"):
        assert not _remoting_rule(edge("connection", target)), target
    assert not _remoting_rule(edge("processors", f"{_S}.reader"))
    assert _remoting_rule(edge("processors", _DS))
    for module in ("send", "pull", "pull_hold", "transaction", "admin", "broker", "served"):
        assert not _remoting_rule(edge(f"processors.{module}", f"{_S}.message_store")), module
        assert _remoting_rule(edge(f"processors.{module}", _DS)), module
    assert f"{_R}.processors.pull" in MODULES and f"{_R}.processors" in PACKAGES
    assert _remoting_rule(edge("processorsx", f"{_S}.message_store"))
    assert _remoting_rule(edge("server", f"{_S}.message_store"))
    assert not _remoting_rule(edge("server", f"{_R}.command"))
