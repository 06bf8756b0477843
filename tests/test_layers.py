"""The house's layers, read from the code: every module of swax_lightning/ (and kernels/) sits in a layer, imports
only from its own layer or those below it, lazy imports (inside functions) counted, and no import circle joins two
modules. `python tests/test_layers.py` prints the same facts as a report: modules per folder, the arrows between
subpackages, circles, and the longest functions.

Layers, bottom up: core and kernels; model; data; training; evals; pretrained and study; commands. The package's
own __init__ and __main__ are its face: __main__ runs the commands, and __init__ (the version, and core/moved.py's
finder) imports only core, so any layer may read the version from it.
"""
from __future__ import annotations

import ast
import sys
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "swax_lightning"
LAYERS = {"core": 0, "kernels": 0, "model": 1, "data": 1, "training": 2, "evals": 3, "pretrained": 4, "study": 4,
          "commands": 5}
FACE = {"swax_lightning", "swax_lightning.__main__"}


def module_files() -> dict[str, Path]:
    """Module name -> file, the kernels under swax_lightning.kernels (their import name); the link is not followed
    twice, and the lm-eval plugin's sitecustomize (run by lm-eval, never imported) is left out."""
    files = {}
    for base, prefix in ((PACKAGE, "swax_lightning"), (ROOT / "kernels", "swax_lightning.kernels")):
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(base)
            if rel.parts[0] == "kernels" and base == PACKAGE:
                continue  # the link to ../kernels
            parts = [*rel.with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            files[".".join([prefix, *parts])] = path
    return files


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """The framework modules `path` imports anywhere in it (top level or lazily), `from X import y` counted as X.y
    where X.y is a module, else as X."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        out |= {t for t in targets if t.startswith("swax_lightning") and t in known}
    out.discard(name)
    return out


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def graph() -> dict[str, set[str]]:
    files = module_files()
    return {name: imported_modules(name, path, set(files)) for name, path in files.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), a package's __init__ not counted as
    importing its children (Python imports a parent before its child anyway)."""
    index, low, stack, on_stack, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
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
                out.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in edges:
        if v not in index:
            visit(v)
    return out


def arrows_against_the_layers(edges: dict[str, set[str]]) -> list[str]:
    bad = []
    for source, targets in edges.items():
        if source in FACE:
            continue
        here = layer_of(source)
        for target in targets:
            there = layer_of(target)
            if there is not None and LAYERS[there] > LAYERS[here]:
                bad.append(f"{source} ({here}) imports {target} ({there})")
            elif there not in (here, None) and LAYERS[there] == LAYERS[here]:
                bad.append(f"{source} ({here}) imports {target} ({there}, a layer beside it)")
    return sorted(bad)


def test_every_module_sits_in_a_layer():
    strays = [name for name in module_files() if name not in FACE and layer_of(name) is None]
    assert not strays, f"modules outside every layer folder: {strays}"


def test_no_import_runs_against_the_layers():
    assert arrows_against_the_layers(graph()) == []


def test_no_import_circle_joins_two_modules():
    assert circles(graph()) == []


def test_the_scan_sees_lazy_imports_and_a_wrong_arrow(tmp_path):
    # The oracle of the scan itself: a lazy import inside a function is an arrow, and one that runs up is reported.
    fake = tmp_path / "mod.py"
    fake.write_text("def f():\n    from swax_lightning.commands import cli\n")
    known = {"swax_lightning.commands", "swax_lightning.commands.cli", "swax_lightning.model.fake"}
    found = imported_modules("swax_lightning.model.fake", fake, known)
    assert found == {"swax_lightning.commands.cli"}
    assert arrows_against_the_layers({"swax_lightning.model.fake": found}) == [
        "swax_lightning.model.fake (model) imports swax_lightning.commands.cli (commands)"]
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def report() -> str:
    edges, files = graph(), module_files()
    folders = Counter(layer_of(name) or "(package face)" for name in files)
    between = defaultdict(set)
    for source, targets in edges.items():
        for target in targets:
            a, b = layer_of(source) or "face", layer_of(target) or "face"
            if a != b:
                between[a].add(b)
    longest = []
    for path in files.values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                longest.append((node.end_lineno - node.lineno + 1, f"{path.relative_to(ROOT)}:{node.lineno} "
                                                                    f"{node.name}"))
    lines = ["modules per folder: " + ", ".join(f"{k} {v}" for k, v in sorted(folders.items(), key=lambda kv:
                                                                                 LAYERS.get(kv[0], -1)))]
    lines += ["imports between subpackages (lazy ones counted):"]
    lines += [f"  {a} -> {', '.join(sorted(b, key=lambda x: LAYERS.get(x, -1)))}"
              for a, b in sorted(between.items(), key=lambda kv: -LAYERS.get(kv[0], 9))]
    lines += [f"arrows against the layers: {arrows_against_the_layers(edges) or 'none'}",
              f"circles: {circles(edges) or 'none'}", "longest functions (lines):"]
    lines += [f"  {n:4d}  {where}" for n, where in sorted(longest, reverse=True)[:8]]
    return "\n".join(lines)


if __name__ == "__main__":
    print(report())
