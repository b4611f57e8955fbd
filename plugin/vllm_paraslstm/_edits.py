# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The series' edits of existing vLLM modules, performed from the diffs.

The wheel carries `upstream-edits/*.diff`. `perform(module, diffs)` applies the
diffs, in order, to the text of the installed module file, then makes the
running module match the patched text, top-level statement by statement:

- an added import, class or function is defined in the module's namespace;
- a class the diffs change gets the added or changed members set on it (the
  class object others hold stays the same);
- a function the diffs change is redefined from the patched source and
  replaces the original in the module and wherever another module imported
  it by name;
- a dict literal the diffs add keys to gets those keys in the live dict.

Anything else a diff changes raises, so that no edit is dropped silently.
The diffs stay the one source of the code they add; a second diff may edit
what the first one added.
"""

import ast
import importlib.abc
import importlib.machinery
import linecache
import sys
from importlib import resources
from pathlib import Path
from types import ModuleType

import regex as re

_FILE = re.compile(r"^diff --git a/\S+ b/(\S+)$", re.MULTILINE)
_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@.*$", re.MULTILINE)
_performed: set[str] = set()


def read(diff_name: str) -> str | None:
    """The diff shipped in the wheel (or, from a source checkout, the repo's
    `upstream-edits/`), or None when there is none of that name."""
    shipped = resources.files(__package__).joinpath("edits", diff_name)
    if shipped.is_file():
        return shipped.read_text()
    checkout = Path(__file__).resolve().parents[2] / "upstream-edits" / diff_name
    return checkout.read_text() if checkout.is_file() else None


def apply(text: str, diff: str, path: str, diff_name: str) -> str:
    """`text` (the file at `path`) with the diff's hunks for `path` applied.
    A hunk goes where its old lines occur nearest to its stated line."""
    lines = text.splitlines(keepends=True)
    sections = _FILE.split(diff)[1:]
    for target, section in zip(sections[::2], sections[1::2]):
        if target != path:
            continue
        parts = _HUNK.split(section)[1:]
        shift = 0
        for start, body in zip(parts[::2], parts[1::2]):
            old, new = [], []
            for line in body.splitlines(keepends=True)[1:]:
                tag, content = (" ", line) if line == "\n" else (line[:1], line[1:])
                if tag in (" ", "-"):
                    old.append(content)
                if tag in (" ", "+"):
                    new.append(content)
            want = int(start) - 1 + shift
            found = [
                i
                for i in range(len(lines) - len(old) + 1)
                if lines[i : i + len(old)] == old
            ]
            if not found:
                raise RuntimeError(
                    f"vllm-paraslstm: {diff_name} does not apply to the "
                    f"installed {path} (hunk at line {start}); this plugin is "
                    "for vLLM v0.32"
                )
            at = min(found, key=lambda i: abs(i - want))
            lines[at : at + len(old)] = new
            shift += len(new) - len(old)
    return "".join(lines)


def _members(node: ast.ClassDef) -> dict[str, str]:
    members = {}
    for stmt in node.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            members[stmt.name] = ast.dump(stmt)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            for target in getattr(stmt, "targets", [getattr(stmt, "target", None)]):
                if isinstance(target, ast.Name):
                    members[target.id] = ast.dump(stmt)
    return members


def _dict_name(node: ast.stmt) -> str | None:
    """The name a top-level `NAME = {...}` (or `NAME: T = {...}`) assigns."""
    if isinstance(node, ast.AnnAssign):
        target = node.target
    elif isinstance(node, ast.Assign) and len(node.targets) == 1:
        target = node.targets[0]
    else:
        return None
    if isinstance(target, ast.Name) and isinstance(node.value, ast.Dict):
        return target.id
    return None


def _rebind(name: str, old: object, new: object) -> None:
    """Replace `old` by `new` wherever a loaded module holds it as `name`."""
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if isinstance(namespace, dict) and namespace.get(name) is old:
            namespace[name] = new


def perform(module: ModuleType, diff_names: list[str]) -> None:
    """Make `module` what the diffs (those that exist) make of its file."""
    if module.__name__ in _performed:
        return
    path = module.__name__.replace(".", "/") + ".py"
    original = Path(module.__file__).read_text()
    patched = original
    for name in diff_names:
        if (diff := read(name)) is not None:
            patched = apply(patched, diff, path, name)
    _performed.add(module.__name__)
    if patched == original:
        return

    namespace = vars(module)
    # The patched text, for tracebacks; log records name the file `path` ends in.
    filename = f"<vllm-paraslstm edits>/{path}"
    lines = patched.splitlines(keepends=True)
    linecache.cache[filename] = (len(patched), None, lines, filename)
    old_nodes = ast.parse(original).body
    old_by_name = {
        n.name: n for n in old_nodes if isinstance(n, (ast.ClassDef, ast.FunctionDef))
    }
    old_dumps = {ast.dump(n) for n in old_nodes}
    old_dicts = {_dict_name(n): n.value for n in old_nodes if _dict_name(n)}

    def run(node: ast.stmt, into: dict) -> None:
        code = compile(ast.Module(body=[node], type_ignores=[]), filename, "exec")
        exec(code, namespace, into)

    def value(expr: ast.expr) -> object:
        return eval(compile(ast.Expression(body=expr), filename, "eval"), namespace)

    for node in ast.parse(patched).body:
        if ast.dump(node) in old_dumps:
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            run(node, namespace)
        elif isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            old = old_by_name.get(node.name)
            scratch: dict = {}
            run(node, scratch)
            new = scratch[node.name]
            if old is None:
                namespace[node.name] = new
            elif isinstance(node, ast.FunctionDef):
                _rebind(node.name, namespace[node.name], new)
                namespace[node.name] = new
            else:
                live = namespace[node.name]
                before = _members(old)
                for member, dump in _members(node).items():
                    if before.get(member) != dump:
                        attr = new.__dict__[member]
                        code = getattr(
                            getattr(attr, "__func__", attr), "__code__", None
                        )
                        # zero-argument super() would see the scratch class
                        assert code is None or "__class__" not in code.co_freevars
                        setattr(live, member, attr)
        elif (name := _dict_name(node)) in old_dicts:
            before = {ast.dump(k) for k in old_dicts[name].keys if k is not None}
            live = namespace[name]
            for key, val in zip(node.value.keys, node.value.values):
                if key is not None and ast.dump(key) not in before:
                    live.setdefault(value(key), value(val))
        else:
            raise NotImplementedError(
                f"vllm-paraslstm: cannot perform the edit of {path} at line "
                f"{node.lineno} ({filename}) at run time"
            )


class _AfterImport(importlib.abc.MetaPathFinder):
    """Performs the edits of one module right after it is first imported."""

    def __init__(self, name: str, diff_names: list[str]) -> None:
        self.name, self.diff_names = name, diff_names

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_perform(module: ModuleType) -> None:
            exec_module(module)
            perform(module, self.diff_names)

        spec.loader.exec_module = exec_and_perform
        return spec


def perform_on_import(name: str, diff_names: list[str]) -> None:
    """`perform` on module `name` now if it is loaded, else when it is."""
    if name in sys.modules:
        perform(sys.modules[name], diff_names)
    elif not any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, diff_names))
