"""YAML documents with the source line of every value, for error messages that point at a line."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import yaml

Path = tuple[str | int, ...]


@dataclass
class SourceDoc:
    """One YAML document: its plain data and a map from value path to 1-based line."""

    file: str
    index: int
    data: Any
    lines: dict[Path, int] = field(default_factory=dict)
    start_line: int = 1

    def line_of(self, path: Path) -> int:
        """The line of ``path``, or of its nearest ancestor that exists in the source."""
        p = tuple(path)
        while p:
            if p in self.lines:
                return self.lines[p]
            p = p[:-1]
        return self.start_line


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys."""


def _build(loader: _Loader, node: yaml.Node, path: Path, lines: dict[Path, int]) -> Any:
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for k_node, v_node in node.value:
            key = loader.construct_object(k_node, deep=True)
            if isinstance(key, (list, dict)):
                raise yaml.constructor.ConstructorError(
                    None, None, "mapping keys must be scalars", k_node.start_mark)
            if key in out:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", k_node.start_mark)
            out[key] = _build(loader, v_node, (*path, key), lines)
            lines[(*path, key)] = k_node.start_mark.line + 1
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_build(loader, v, (*path, i), lines) for i, v in enumerate(node.value)]
    return loader.construct_object(node, deep=True)


def load_documents(text: str, file: str) -> Iterator[SourceDoc]:
    """Yield every non-empty document of ``text``. Raises ``yaml.YAMLError`` on bad YAML."""
    loader = _Loader(text)
    try:
        index = 0
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            lines: dict[Path, int] = {}
            data = _build(loader, node, (), lines)
            start = node.start_mark.line + 1
            if data is not None:
                yield SourceDoc(file, index, data, lines, start)
            index += 1
    finally:
        loader.dispose()
