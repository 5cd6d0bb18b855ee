"""Gradio's internals are touched in one package (explorer/web/gradio_adapter), whose tests check their shapes:
no other module of the app assigns to a Gradio object's attribute or names one of those internals. And the
modules of the web, panel and state layers import no ``_private`` name from one another."""
from __future__ import annotations

import ast
import functools
from pathlib import Path

import gradio
import pytest

ROOT = Path(__file__).resolve().parents[1]
ADAPTER = ROOT / "explorer" / "web" / "gradio_adapter"
APP_SOURCES = [ROOT / "app.py", *sorted((ROOT / "explorer").rglob("*.py"))]

#: Gradio internals (attributes, then classes) the adapter alone may name.
INTERNAL_ATTRIBUTES = {"_queue", "fns", "state_holder", "process_api", "preprocess_data", "constructor_args",
                       "trigger_after", "pending_event_ids_session", "pending_messages_per_session", "session_data",
                       "time_last_used", "state_data", "ANAYLTICS_CACHE_FREQUENCY"}
INTERNAL_CLASSES = {"SessionState", "StateHolder", "BlockFunction"}


@functools.lru_cache(maxsize=1)
def gradio_attribute_names() -> frozenset[str]:
    """Every attribute Gradio's blocks, components, layouts, events, queue and sessions set or define."""
    root = Path(gradio.__file__).parent
    files = [root / f for f in ("blocks.py", "block_function.py", "queueing.py", "state_holder.py", "events.py",
                                "component_meta.py", "route_utils.py")]
    files += [*(root / "components").glob("*.py"), *(root / "layouts").glob("*.py")]
    names: set[str] = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                            and target.value.id == "self":
                        names.add(target.attr)
            elif isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        names.add(item.name)
                    elif isinstance(item, ast.Assign):
                        names.update(t.id for t in item.targets if isinstance(t, ast.Name))
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        names.add(item.target.id)
    return frozenset(names)


def _imports_gradio(tree: ast.AST) -> bool:
    return any(isinstance(n, ast.Import) and any(a.name.split(".")[0] == "gradio" for a in n.names)
               or isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "gradio" for n in ast.walk(tree))


def gradio_attribute_writes(source: str) -> list[str]:
    """Each place ``source`` assigns to, deletes or ``setattr``s an attribute Gradio's objects have (on anything
    but ``self``/``cls``), or assigns into the ``gradio`` module: ``line: what``."""
    tree = ast.parse(source)
    names = gradio_attribute_names()
    found = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr"):
            owner = node.args[0] if node.args else None
            if not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")):
                found.append(f"{node.lineno}: {ast.unparse(node)[:80]}")
            continue
        for target in targets:
            while isinstance(target, ast.Subscript):  # block.constructor_args[key] = v changes the object too
                target = target.value
            if not isinstance(target, ast.Attribute):
                continue
            base = target.value
            own = isinstance(base, ast.Name) and base.id in ("self", "cls")
            if (isinstance(base, ast.Name) and base.id in ("gr", "gradio")) or (not own and target.attr in names):
                found.append(f"{node.lineno}: {ast.unparse(target)}")
    return found


def test_the_scan_finds_each_kind_of_patch():
    patched = """
import gradio as gr
demo.preprocess_data = wrapped
queue.push = push_within_cap
fn.targets = []
block.constructor_args["label"] = "x"
setattr(block, "value", 3)
queue.ANAYLTICS_CACHE_FREQUENCY += 1
del holder.session_data
gr.Blocks = Mine
"""
    found = gradio_attribute_writes(patched)
    assert len(found) == 8, found
    assert gradio_attribute_writes("self.value = 1\nroom['x'] = 2\nmodel.weight_key = 3\n") == []


@pytest.mark.parametrize("path", [p for p in APP_SOURCES if ADAPTER not in p.parents], ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_but_the_adapter_assigns_to_a_gradio_object(path):
    source = path.read_text()
    if not _imports_gradio(ast.parse(source)):  # the app's Gradio objects live in modules that import it
        return
    assert gradio_attribute_writes(source) == [], f"{path.name}: use explorer/web/gradio_adapter"


@pytest.mark.parametrize("path", [p for p in APP_SOURCES if ADAPTER not in p.parents], ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_but_the_adapter_names_a_gradio_internal(path):
    tree = ast.parse(path.read_text())
    named = [f"{n.lineno}: {n.attr}" for n in ast.walk(tree)
             if isinstance(n, ast.Attribute) and n.attr in INTERNAL_ATTRIBUTES]
    named += [f"{n.lineno}: {n.id}" for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id in INTERNAL_CLASSES]
    named += [f"{n.lineno}: from {n.module}" for n in ast.walk(tree)
              if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("gradio.")]
    assert named == [], f"{path.name}: use explorer/web/gradio_adapter"


OURS = ("explorer", "lens", "models", "training", "app")
LAYERS = [ROOT / "app.py", *sorted(p for d in ("web", "panels", "state") for p in (ROOT / "explorer" / d).glob("*.py"))]


@pytest.mark.parametrize("path", LAYERS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_private_name_is_imported_from_another_module(path):
    tree = ast.parse(path.read_text())
    modules: set[str] = set()
    private = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "").split(".")[0] in OURS):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    private.append(f"{node.lineno}: from {node.module} import {alias.name}")
                modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            modules.update(a.asname or a.name.split(".")[0] for a in node.names if a.name.split(".")[0] in OURS)
    private += [f"{n.lineno}: {n.value.id}.{n.attr}" for n in ast.walk(tree)
                if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in modules
                and n.attr.startswith("_") and not n.attr.startswith("__")]
    assert private == []
