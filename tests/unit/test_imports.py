"""No import circle among rlft's modules, counting every import statement (function-local ones too)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def import_graph() -> dict[str, set[str]]:
    modules = {}
    for path in (ROOT / "rlft").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {m: set() for m in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def cycle_from(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """A path start -> ... -> start, if there is one (depth-first)."""
    stack, seen = [(start, [start])], set()
    while stack:
        node, path = stack.pop()
        for nxt in graph[node]:
            if nxt == start:
                return path + [start]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, path + [nxt]))
    return None


def test_the_graph_sees_real_imports():
    graph = import_graph()
    assert "rlft.errors" in graph["rlft.worker"] and "rlft.rollout.sampling" in graph["rlft.rollout.vllm_engine"]
    assert cycle_from({"a": {"b"}, "b": {"a"}}, "a") == ["a", "b", "a"]


def test_no_module_imports_itself_through_others():
    graph = import_graph()
    circles = [c for c in (cycle_from(graph, m) for m in sorted(graph)) if c]
    assert not circles, " ; ".join(" -> ".join(c) for c in circles[:3])
