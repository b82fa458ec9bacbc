"""The house rules of tune_magic/, checked mechanically (issue 19, "One house").

Read from the source files under ``tune_magic/`` (``ast`` and ``tokenize``; nothing is imported):

(a) no module over :data:`MAX_MODULE_LINES` lines, or :data:`CONCEPT_MODULE_LINES` where its
    docstring's first paragraph says ``One concept:`` and why (issue 27: sizes follow concepts);
(b) no function over :data:`MAX_FUNCTION_LINES` lines (``def`` line to last line, docstring
    included) unless its docstring has a line starting with :data:`LONG_MARKER` that says why;
(c) no import cycle among the package's modules, counting imports inside functions (a lazy
    import still ties two modules together), under ``if TYPE_CHECKING:`` and by name
    (``importlib.import_module``); only a package facade's call-time import of its own part is
    left out (:func:`facade_calls`); at most :data:`MAX_TOP_MODULES` modules directly in the package;
(d) no module uses a private name (``_x``) of another tune_magic module: neither
    ``from tune_magic.m import _x`` nor ``m._x`` on an imported tune_magic module;
(e) outside ``tune_magic/schedulers/``, the engine words (``slurm``, ``sbatch``, ``squeue``, any
    case, also inside identifiers) appear only in documentation: comments and docstrings. Other
    string literals count as code.

Each test names every offender with its file and line, so one run lists all that is left to fix.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import tune_magic

PACKAGE = Path(tune_magic.__file__).parent
ROOT = PACKAGE.parent
MAX_MODULE_LINES = 600
#: The cap for a module whose docstring's first paragraph says "One concept: <why>".
CONCEPT_MODULE_LINES = 900
CONCEPT_MARKER = "One concept:"
MAX_FUNCTION_LINES = 60
#: A docstring line starting with this says why a function is longer than MAX_FUNCTION_LINES.
LONG_MARKER = "Long:"
ENGINE_WORDS = re.compile(r"slurm|sbatch|squeue", re.IGNORECASE)
ENGINE_HOME = PACKAGE / "schedulers"


def sources() -> dict[str, Path]:
    """Dotted module name -> file, for every module under tune_magic/."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


SOURCES = sources()
TREES = {name: ast.parse(path.read_text(), str(path)) for name, path in SOURCES.items()}


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


# -- (a) module size ----------------------------------------------------------------------------


def line_cap(text: str) -> int:
    """The module's size cap: :data:`CONCEPT_MODULE_LINES` when its docstring's first paragraph
    says :data:`CONCEPT_MARKER` with a reason after it, else :data:`MAX_MODULE_LINES`."""
    doc = ast.get_docstring(ast.parse(text)) or ""
    first = doc.split("\n\n", 1)[0]
    why = first.split(CONCEPT_MARKER, 1)[1].strip() if CONCEPT_MARKER in first else ""
    return CONCEPT_MODULE_LINES if len(why) >= 20 else MAX_MODULE_LINES


def test_the_size_cap_rises_only_for_a_module_that_says_why():
    assert line_cap('"""Submitting. One concept: the plan to the job id, one protocol."""\n') == CONCEPT_MODULE_LINES
    assert line_cap('"""Submitting. One concept:"""\n') == MAX_MODULE_LINES  # no reason given
    assert line_cap('"""Submitting.\n\nOne concept: said only in a later paragraph."""\n') == MAX_MODULE_LINES
    assert line_cap("x = 1\n") == MAX_MODULE_LINES


def test_no_module_is_over_the_line_limit():
    long = [f"{rel(p)}: {n} lines (cap {cap})" for p in SOURCES.values()
            if (n := len((text := p.read_text()).splitlines())) > (cap := line_cap(text))]
    assert not long, (f"modules over {MAX_MODULE_LINES} lines (split them by topic), or over {CONCEPT_MODULE_LINES} "
                      f"for one concept:\n" + "\n".join(long))


def test_the_slurm_package_is_one_module_per_concept():
    """Issue 27: submit, status, exits, options, array, requeue, node (and its node-local path
    check), and the scheduler in __init__; a module split only to stay under the cap is gone."""
    slurm = sorted(p.stem for p in (PACKAGE / "schedulers" / "slurm").glob("*.py"))
    assert slurm == ["__init__", "array", "exits", "node", "nodelocal", "options", "requeue", "status", "submit"]


# -- (b) function size --------------------------------------------------------------------------


def long_functions(tree: ast.AST) -> list[tuple[int, str, int]]:
    """``(line, name, length)`` of each function over the limit without a ``Long:`` reason."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            doc = ast.get_docstring(node) or ""
            reasoned = any(line.strip().startswith(LONG_MARKER) for line in doc.splitlines())
            if length > MAX_FUNCTION_LINES and not reasoned:
                out.append((node.lineno, node.name, length))
    return out


def test_the_function_rule_sees_a_long_function_and_its_reason():
    body = "\n".join(f"    x = {i}" for i in range(MAX_FUNCTION_LINES))
    bare = f"def f():\n{body}\n"
    reasoned = f'def f():\n    """Do it.\n\n    Long: one table.\n    """\n{body}\n'
    short = "def f():\n    return 1\n"
    assert long_functions(ast.parse(bare)) == [(1, "f", MAX_FUNCTION_LINES + 1)]
    assert long_functions(ast.parse(reasoned)) == []
    assert long_functions(ast.parse(short)) == []


def test_no_function_is_over_the_line_limit_without_a_reason():
    found = [f"{rel(SOURCES[m])}:{line} {name} ({n} lines)"
             for m, tree in TREES.items() for line, name, n in long_functions(tree)]
    assert not found, (f"functions over {MAX_FUNCTION_LINES} lines: break them into named steps, or give a "
                       f"docstring line '{LONG_MARKER} <why>':\n" + "\n".join(found))


# -- (c) import cycles --------------------------------------------------------------------------


def imported_modules(name: str, tree: ast.AST) -> dict[str, int]:
    """The tune_magic modules ``name`` imports anywhere in its file -> the line of the first import."""
    is_pkg = SOURCES[name].name == "__init__.py"
    package = name.split(".") if is_pkg else name.split(".")[:-1]
    out: dict[str, int] = {}
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # `from pkg import sub` imports the submodule; `from mod import name` the module
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in SOURCES else module for a in node.names]
        for target in targets:
            if target in SOURCES and target != name:
                out.setdefault(target, node.lineno)
    return out


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle_and_only_a_cycle():
    assert cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b": 1}, "b": {}}) == []


def test_imports_inside_functions_count():
    tree = ast.parse("def f():\n    from tune_magic.logs import parse\n")
    assert imported_modules("tune_magic.errors", tree) == {"tune_magic.logs.parse": 2}


def facade_calls(name: str, tree: ast.AST) -> set[str]:
    """The own submodules a package's ``__init__`` imports inside a function (at call time).

    A package's ``__init__`` is its facade: a method there may hand its work to one of the
    package's parts (``Job.resume`` -> ``tune_magic.job.resume``), which builds on the facade's
    model in turn. That call-time edge is the only one the cycle rule leaves out; every other
    import counts, inside functions or not."""
    if SOURCES[name].name != "__init__.py":
        return set()
    out = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith(name + "."):
                    out.add(node.module)
    return out


def test_a_facade_call_is_only_a_call_time_import_of_an_own_part():
    tree = ast.parse("from tune_magic.job.launch import launch\n"
                     "def f():\n    from tune_magic.job.resume import resume\n    from tune_magic.logs import parse\n")
    assert facade_calls("tune_magic.job", tree) == {"tune_magic.job.resume"}
    assert facade_calls("tune_magic.job.launch", tree) == set()  # not a package's __init__


def module_edges() -> dict[str, dict[str, int]]:
    edges = {m: imported_modules(m, tree) for m, tree in TREES.items()}
    for m, tree in TREES.items():
        for part in facade_calls(m, tree):
            edges[m].pop(part, None)
    return edges


def test_no_import_cycle():
    edges = module_edges()
    found = cycles(edges)
    shown = []
    for component in found:
        members = set(component)
        shown.append(" <-> ".join(component) + ": " + "; ".join(
            f"{rel(SOURCES[m])}:{line} imports {t}" for m in component for t, line in edges[m].items() if t in members))
    assert not found, "import cycles (counting imports inside functions):\n" + "\n".join(shown)


#: Release 0.1.0's module paths: re-exports its supervisors import after an upgrade (issue 27 keeps them).
#: They cannot move into a package (``_compat/``) behind an import hook: a 0.1.0 supervisor still running
#: has 0.1.0's ``tune_magic/__init__.py`` loaded, which installs no hook, so its late ``import
#: tune_magic.follow`` is answered only by a file at that path (tests/e2e/test_upgrade.py runs one).
RELEASE_0_1_0_PATHS = {"failure", "follow", "logparse", "oom"}
MAX_TOP_MODULES = 10


def test_at_most_ten_modules_directly_in_the_package():
    top = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert RELEASE_0_1_0_PATHS <= set(top), "release 0.1.0's paths must stay importable"
    for stem in RELEASE_0_1_0_PATHS:
        body = [n for n in TREES[f"tune_magic.{stem}"].body if not isinstance(n, ast.Expr)]
        assert all(isinstance(n, ast.ImportFrom) for n in body), f"tune_magic/{stem}.py must only re-export"
    own = [t for t in top if t not in RELEASE_0_1_0_PATHS]
    assert len(own) <= MAX_TOP_MODULES, f"{len(own)} modules directly in tune_magic/ (move them into a package): {own}"


# -- (d) private names --------------------------------------------------------------------------


def private_uses(name: str, tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, what)`` for each private name of another tune_magic module that ``name`` uses."""
    is_pkg = SOURCES[name].name == "__init__.py"
    package = name.split(".") if is_pkg else name.split(".")[:-1]
    out = []
    module_aliases: dict[str, str] = {}  # local name -> tune_magic module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module not in SOURCES:
                continue
            for a in node.names:
                full = f"{module}.{a.name}"
                if a.name.startswith("_") and not a.name.startswith("__") and module != name:
                    out.append((node.lineno, f"from {module} import {a.name}"))
                if full in SOURCES:
                    module_aliases[a.asname or a.name] = full
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name in SOURCES:
                    if any(p.startswith("_") and not p.startswith("__") for p in a.name.split(".")):
                        out.append((node.lineno, f"import {a.name}"))
                    if a.asname:
                        module_aliases[a.asname] = a.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in module_aliases and node.attr.startswith("_")
                and not node.attr.startswith("__") and module_aliases[node.value.id] != name):
            out.append((node.lineno, f"{node.value.id}._{node.attr[1:]} ({module_aliases[node.value.id]})"))
    return sorted(set(out))


def test_the_private_rule_sees_both_forms():
    tree = ast.parse("from tune_magic.logs.parse import _FIELD_RE, LogParser\n"
                     "from tune_magic.registry import store as jobstore\n"
                     "x = jobstore._private\ny = jobstore.public\n")
    assert private_uses("tune_magic.errors", tree) == [
        (1, "from tune_magic.logs.parse import _FIELD_RE"),
        (3, "jobstore._private (tune_magic.registry.store)"),
    ]


def test_no_module_uses_another_modules_private_names():
    found = [f"{rel(SOURCES[m])}:{line} {what}" for m, tree in TREES.items() for line, what in private_uses(m, tree)]
    assert not found, ("private names used across modules (make the name public and document it, or move "
                       "the code):\n" + "\n".join(found))


# -- (e) engine names ---------------------------------------------------------------------------


def docstring_spans(tree: ast.AST) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Start and end ``(line, column)`` of every module, class and function docstring."""
    spans = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                spans.append(((first.lineno, first.col_offset), (first.end_lineno, first.end_col_offset)))
    return spans


def engine_words_in_code(text: str) -> list[tuple[int, str]]:
    """``(line, token)`` of each token of ``text`` naming an engine that is not a comment or a docstring."""
    spans = docstring_spans(ast.parse(text))
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT or not ENGINE_WORDS.search(tok.string):
            continue
        if tok.type == tokenize.STRING and any(start <= tok.start and tok.end <= end for start, end in spans):
            continue
        out.append((tok.start[0], tok.string if len(tok.string) < 60 else tok.string[:57] + "..."))
    return out


def test_the_engine_rule_tells_documentation_from_code():
    text = ('"""Runs on SLURM too."""\n'
            "# squeue is asked elsewhere\n"
            "def f():\n"
            '    """sbatch: see the scheduler."""\n'
            '    return "slurm"\n'
            "slurm_job_id = 1\n")
    assert engine_words_in_code(text) == [(5, '"slurm"'), (6, "slurm_job_id")]


def test_outside_schedulers_engine_names_are_only_documentation():
    found = [f"{rel(path)}:{line} {token}" for path in SOURCES.values()
             if ENGINE_HOME not in path.parents for line, token in engine_words_in_code(path.read_text())]
    assert not found, ("an engine named in code outside tune_magic/schedulers/ (move it into the scheduler's "
                       "package, behind the seam):\n" + "\n".join(found))


def scheduler_names_compared(text: str) -> list[tuple[int, str]]:
    """(line, source) of each comparison of a value with the name of a built-in scheduler
    (``== "local"``, ``"slurm" != x``, ``in ("local", ...)``) in ``text``."""
    names = {"local", "slurm"}
    out = []
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.Compare):
            continue
        parts = [node.left, *node.comparators]
        consts = [c for p in parts for c in ([p] if not isinstance(p, (ast.Tuple, ast.List, ast.Set)) else p.elts)]
        if any(isinstance(c, ast.Constant) and c.value in names for c in consts):
            out.append((node.lineno, ast.unparse(node)))
    return out


def test_the_scheduler_name_rule_sees_every_form():
    text = ('a = s == "local"\nb = "slurm" != s\nc = s in ("local", "x")\nd = s == "locale"\n'
            'e = {"local": 1}\n')
    assert [line for line, _ in scheduler_names_compared(text)] == [1, 2, 3]


def test_outside_schedulers_schedulers_are_asked_never_named():
    found = [f"{rel(path)}:{line} {src}" for path in SOURCES.values()
             if ENGINE_HOME not in path.parents for line, src in scheduler_names_compared(path.read_text())]
    assert not found, ("a scheduler compared by name outside tune_magic/schedulers/ (ask it a capability on "
                       "tune_magic.schedulers.base.Scheduler instead):\n" + "\n".join(found))


SWEEP_HOME = "tune_magic.sweeping"


def sweep_only_modules(edges: dict[str, dict[str, int]]) -> list[str]:
    """Modules outside the sweep package that only sweeps use (every module importing them is in
    the sweep package), or whose name says sweep."""
    importers: dict[str, set[str]] = {}
    for module, targets in edges.items():
        for target in targets:
            importers.setdefault(target, set()).add(module)
    out = []
    for module in edges:
        if module == SWEEP_HOME or module.startswith(SWEEP_HOME + "."):
            continue
        users = importers.get(module, set())
        named = "sweep" in module.rsplit(".", 1)[-1]
        if named or (users and all(u == SWEEP_HOME or u.startswith(SWEEP_HOME + ".") for u in users)):
            out.append(module)
    return sorted(out)


def test_the_sweep_only_rule_sees_a_module_only_sweeps_use_and_a_sweep_name():
    edges = {"tune_magic.sweeping.runner": {"tune_magic.plan.pool": 1, "tune_magic.logs.parse": 2},
             "tune_magic.sweeping.create": {"tune_magic.plan.pool": 1},
             "tune_magic.job": {"tune_magic.logs.parse": 1},
             "tune_magic.plan.pool": {}, "tune_magic.logs.parse": {}, "tune_magic.registry.sweepstore": {}}
    assert sweep_only_modules(edges) == ["tune_magic.plan.pool", "tune_magic.registry.sweepstore"]
    edges["tune_magic.ui.cards"] = {"tune_magic.plan.pool": 3}  # a user outside the sweep package
    assert sweep_only_modules(edges) == ["tune_magic.registry.sweepstore"]


def test_every_sweep_only_module_lives_in_the_sweep_package():
    """Issue 27: one concept, one place. A module that only the sweep package uses (or named after
    sweeps) belongs in it."""
    found = sweep_only_modules(module_edges())
    assert not found, "sweep-only modules outside tune_magic/sweeping/ (move them in):\n" + "\n".join(found)


def test_the_rules_read_every_module():
    """The rules above read the whole package: every module is found and parses."""
    assert len(SOURCES) == len(list(PACKAGE.rglob("*.py"))) > 50
    assert "tune_magic.logs.parse" in SOURCES and "tune_magic.schedulers.slurm.status" in SOURCES


def _installed_packages() -> set[str]:
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return set(data["tool"]["setuptools"]["packages"])


def test_every_package_is_installed_by_a_non_editable_install():
    # pyproject lists its packages by hand (recipes/ is mapped in as tune_magic.recipes), so a new
    # package left off the list imports in the editable venv and is missing from a wheel.
    found = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in PACKAGE.rglob("__init__.py")
        if "__pycache__" not in p.parts
    }
    assert found, "no package found under tune_magic/"
    missing = sorted(found - _installed_packages())
    assert not missing, f"add to [tool.setuptools] packages in pyproject.toml: {missing}"


# -- (f) the layers of docs/architecture.md -----------------------------------------------------

ARCHITECTURE = ROOT / "docs" / "architecture.md"


def unit_of(module: str, units: "set[str] | None" = None) -> str:
    """The unit of docs/architecture.md that a tune_magic module belongs to: the longest unit of
    the rules that names its module or a package above it (``schedulers.slurm`` for
    ``tune_magic.schedulers.slurm.submit``, ``sweeping.store`` for ``tune_magic.sweeping.store``),
    else its top-level module or package (``logs`` for ``tune_magic.logs.parse``)."""
    units = RULE_UNITS if units is None else units
    parts = module.split(".")[1:]
    if not parts:
        return "tune_magic"
    for n in range(len(parts), 1, -1):
        if ".".join(parts[:n]) in units:
            return ".".join(parts[:n])
    return parts[0]


def fenced(text: str, kind: str) -> list[str]:
    """The lines of the first ```kind fenced block of ``text``."""
    m = re.search(rf"^```{kind}\n(.*?)^```", text, re.M | re.S)
    assert m, f"docs/architecture.md has no ```{kind} block"
    return [line for line in m.group(1).splitlines() if line.strip()]


def allowed_imports(text: str) -> dict[str, set[str]]:
    rules = {}
    for line in fenced(text, "imports"):
        unit, _, deps = line.partition(":")
        rules[unit.strip()] = {d.strip() for d in deps.split(",") if d.strip()}
    return rules


#: The units docs/architecture.md names (read once): sub-units such as ``sweeping.store`` included.
RULE_UNITS: set[str] = set(allowed_imports(ARCHITECTURE.read_text()))


def known_debt(text: str) -> set[tuple[str, str]]:
    out = set()
    for line in fenced(text, "debt"):
        if line.lstrip().startswith("#"):
            continue  # a comment: the block may be empty of debt
        edge = line.partition(":")[0]
        a, _, b = edge.partition("->")
        out.add((a.strip(), b.strip()))
    return out


def imports_by_name(tree: ast.AST) -> dict[str, int]:
    """``importlib.import_module("tune_magic.x")`` calls with a constant name -> their line."""
    out = {}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
                and node.args[0].value.startswith("tune_magic")):
            out.setdefault(node.args[0].value, node.lineno)
    return out


def layer_breaches(edges: dict[str, dict[str, int]], rules: dict[str, set[str]]) -> list[tuple[str, str, str, int]]:
    """``(unit, imported unit, module, line)`` for each import its unit's rule does not allow."""
    out = []
    for module, targets in edges.items():
        unit = unit_of(module)
        for target, line in targets.items():
            other = unit_of(target)
            if other != unit and other not in rules.get(unit, set()):
                out.append((unit, other, module, line))
    return out


def test_the_layer_rule_sees_a_breach_and_an_import_by_name():
    tree = ast.parse("import importlib\nimportlib.import_module('tune_magic.job.resume')\n")
    assert imports_by_name(tree) == {"tune_magic.job.resume": 2}
    edges = {"tune_magic.logs.parse": {"tune_magic.job.resume": 2, "tune_magic.registry.store": 1},
             "tune_magic.job": {"tune_magic.job.resume": 9},
             "tune_magic.schedulers.slurm.status": {"tune_magic.schedulers.base": 3}}
    rules = {"logs": {"registry"}, "job": set(), "schedulers.slurm": {"schedulers"}}
    assert layer_breaches(edges, rules) == [("logs", "job", "tune_magic.logs.parse", 2)]
    units = {"schedulers", "schedulers.local", "sweeping", "sweeping.store"}
    assert unit_of("tune_magic.schedulers.local.procs", units) == "schedulers.local"
    assert unit_of("tune_magic.schedulers.base", units) == unit_of("tune_magic.schedulers", units) == "schedulers"
    assert unit_of("tune_magic.checkpoints.lineage", units) == "checkpoints"
    assert unit_of("tune_magic.sweeping.store", units) == "sweeping.store"
    assert unit_of("tune_magic.sweeping.runner", units) == unit_of("tune_magic.sweeping", units) == "sweeping"
    assert known_debt("```debt\n# a comment\njob -> ui: why\n```\n") == {("job", "ui")}


def _all_edges() -> dict[str, dict[str, int]]:
    edges = module_edges()
    return {m: {**edges[m], **imports_by_name(tree)} for m, tree in TREES.items()}


def test_every_import_follows_docs_architecture():
    text = ARCHITECTURE.read_text()
    rules = allowed_imports(text)
    units = {unit_of(m) for m in SOURCES}
    assert units <= set(rules), f"units docs/architecture.md does not place: {sorted(units - set(rules))}"
    debt = known_debt(text)
    found = [b for b in layer_breaches(_all_edges(), rules) if (b[0], b[1]) not in debt]
    assert not found, "imports docs/architecture.md does not allow (change the code, or the layers on purpose):\n" + \
        "\n".join(f"{rel(SOURCES[m])}:{line}: {u} imports {o}" for u, o, m, line in found)
    still = {(u, o) for u, o, _, _ in layer_breaches(_all_edges(), rules)}
    assert debt <= still, f"debt paid: remove from docs/architecture.md: {sorted(debt - still)}"


def test_no_import_cycle_even_by_name_beyond_the_known_debt():
    debt = known_debt(ARCHITECTURE.read_text())
    edges = _all_edges()
    for module, targets in edges.items():
        for target in list(targets):
            if (unit_of(module), unit_of(target)) in debt:
                del targets[target]
    assert not cycles(edges), cycles(edges)
