# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The stack's edits of existing vLLM modules, performed from its patches.

The wheel carries the stack (`patches/*/*.patch`) and this package's
`compat/*.diff`. For a module, `perform(module)` applies the stack's hunks for
its file, in stack order, to the text of the installed file. Where they do
not apply (an older vLLM), the `compat/` diffs of that file are applied
instead; a `compat/fix-*.diff`, a fix of a vLLM bug of one release, is
applied where its old lines are found and skipped where they are not (that
vLLM does not have the bug). Then the running module is made to match the
patched text, top level statement by statement:

- an added import, class or function is defined in the module's namespace;
- a class the diffs change gets the added or changed members set on it (the
  class object others hold stays the same);
- a function the diffs change is redefined from the patched source and
  replaces the original in the module and wherever another module imported
  it by name;
- a dict literal the diffs add keys to gets those keys in the live dict.

Anything else a diff changes raises, so that no edit is dropped silently.
"""

import ast
import contextlib
import importlib.abc
import importlib.machinery
import linecache
import sys
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from types import ModuleType

import regex as re

_FILE = re.compile(r"^diff --git a/\S+ b/(\S+)$", re.MULTILINE)
_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@.*$", re.MULTILINE)
_performed: set[str] = set()


def _texts(shipped: str, checkout: str, pattern: str) -> list[tuple[str, str]]:
    """(name, text) of the files the wheel ships under `shipped`, or of the
    source checkout's `checkout` folder; sorted by path."""
    folder = resources.files(__package__).joinpath(shipped)
    if not folder.is_dir():
        folder = Path(__file__).resolve().parents[2] / checkout
    if not folder.is_dir():
        return []
    found = sorted(Path(str(folder)).glob(pattern))
    return [(str(f.relative_to(Path(str(folder)))), f.read_text()) for f in found]


def stack_patches() -> list[tuple[str, str]]:
    return _texts("stack", "patches", "*/*.patch")


def compat_diffs() -> list[tuple[str, str]]:
    return _texts("compat", "plugin/vllm_paraslstm/compat", "*.diff")


def sections(diffs: list[tuple[str, str]], path: str) -> list[tuple[str, str]]:
    """(name, section) for each diff's section that edits `path`."""
    found = []
    for name, diff in diffs:
        parts = _FILE.split(diff)[1:]
        found += [(name, sec) for t, sec in zip(parts[::2], parts[1::2]) if t == path]
    return found


def _split(body: str) -> tuple[list[str], list[str], int, int]:
    """Old and new lines of a hunk, and its leading and trailing context."""
    old, new, tags = [], [], []
    for line in body.splitlines(keepends=True)[1:]:
        tag, content = (" ", line) if line == "\n" else (line[:1], line[1:])
        if tag not in " -+":
            break
        tags.append(tag)
        if tag in (" ", "-"):
            old.append(content)
        if tag in (" ", "+"):
            new.append(content)
    lead = next((i for i, t in enumerate(tags) if t != " "), len(tags))
    trail = next((i for i, t in enumerate(reversed(tags)) if t != " "), len(tags))
    return old, new, lead, trail


def _find(lines: list[str], block: list[str], want: int) -> int | None:
    found = [
        i
        for i in range(len(lines) - len(block) + 1)
        if lines[i : i + len(block)] == block
    ]
    return min(found, key=lambda i: abs(i - want)) if found else None


def apply(text: str, section: str, path: str, name: str) -> str:
    """`text` (the file at `path`) with the hunks of one diff section applied.

    A hunk goes where its old lines occur nearest to its stated line. Where
    they do not occur, a hunk that only adds lines goes next to the longest
    run of its context lines beside the insertion point that does."""
    lines = text.splitlines(keepends=True)
    parts = _HUNK.split(section)[1:]
    shift = 0
    for start, body in zip(parts[::2], parts[1::2]):
        old, new, lead, trail = _split(body)
        want = int(start) - 1 + shift
        at = _find(lines, old, want)
        if at is None and len(old) == lead + trail:
            added = new[lead : len(new) - trail]
            # The context lines next to the insertion point, as many as match.
            for k in range(max(lead, trail), 0, -1):
                before, after = old[max(lead - k, 0) : lead], old[lead : lead + k]
                if k <= lead and (i := _find(lines, before, want)) is not None:
                    at, old, new = i, before, before + added
                    break
                if k <= trail and (i := _find(lines, after, want)) is not None:
                    at, old, new = i, after, added + after
                    break
        if at is None:
            raise RuntimeError(
                f"vllm-paraslstm: {name} does not apply to the installed {path} "
                f"(hunk at line {start})"
            )
        lines[at : at + len(old)] = new
        shift += len(new) - len(old)
    return "".join(lines)


def _apply_all(text: str, diffs: list[tuple[str, str]], path: str) -> str:
    for name, section in diffs:
        text = apply(text, section, path, name)
    return text


def patched_text(original: str, path: str) -> str:
    """The installed file's text with the stack's edits, or, where those do not
    apply (an older vLLM), with the compat diffs that replace them; then the
    compat bug fixes (`fix-*.diff`) whose old lines are there."""
    stack = sections(stack_patches(), path)
    compat = sections(compat_diffs(), path)
    fixes = [(n, sec) for n, sec in compat if n.startswith("fix-")]
    replacements = [(n, sec) for n, sec in compat if not n.startswith("fix-")]
    try:
        patched = _apply_all(original, stack, path)
    except RuntimeError:
        if not replacements:
            raise
        patched, stack = original, []
    if not stack:
        patched = _apply_all(patched, replacements, path)
    for name, section in fixes:
        # Skipped where its old lines are not found: no such bug here.
        with contextlib.suppress(RuntimeError):
            patched = apply(patched, section, path, name)
    return patched


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


def perform(module: ModuleType) -> None:
    """Make `module` what the stack's (or compat) diffs make of its file."""
    if module.__name__ in _performed:
        return
    path = module.__name__.replace(".", "/") + ".py"
    original = Path(module.__file__).read_text()
    patched = patched_text(original, path)
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
    """Runs `then` on one module right after it is first imported."""

    def __init__(self, name: str, then: Callable[[ModuleType], None]) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_then(module: ModuleType) -> None:
            # Not at find_spec: `importlib.util.find_spec` probes import nothing.
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            exec_module(module)
            self.then(module)

        spec.loader.exec_module = exec_and_then
        return spec


def on_import(name: str, then: Callable[[ModuleType], None]) -> None:
    """`then(module)` on module `name` now if it is loaded, else when it is."""
    if name in sys.modules:
        then(sys.modules[name])
    elif not any(
        isinstance(f, _AfterImport) and (f.name, f.then) == (name, then)
        for f in sys.meta_path
    ):
        sys.meta_path.insert(0, _AfterImport(name, then))


def perform_on_import(name: str) -> None:
    """`perform` on module `name` now if it is loaded, else when it is."""
    on_import(name, perform)
