"""Policy source text, read and parsed with hard limits, with the source line of every value.

A policy file is hostile input until proven otherwise, so nothing here can be made to hang,
recurse without bound or allocate without bound:

* :func:`read_source` opens with ``O_NONBLOCK`` (a FIFO never blocks), refuses anything that is
  not a regular file (``/dev/zero``, devices, sockets), checks the size with ``fstat`` before
  reading and never reads more than :data:`LIMITS.max_file_bytes` + 1 bytes, and decodes
  strict UTF-8 (a binary file is an error that names its line);
* :func:`load_documents` builds the data from the parser's event stream with an explicit stack
  (no recursion, so 5,000-deep nesting is an error, not a ``RecursionError``), refuses nesting
  deeper than ``max_depth``, a recursive alias (``a: &a [*a]``) and aliases whose expansion
  would exceed ``max_nodes`` (a "billion laughs" document is refused after a few hundred events,
  not after gigabytes): an alias is charged the full size of what it stands for, although it
  shares the anchored object instead of copying it; and refuses every explicit tag but ``!``
  and ``!!str`` (``!!binary``, ``!!timestamp``, ``!!float`` and the like would silently turn
  the written text into another type).

Every problem is a :class:`yaml.MarkedYAMLError` with a line and the path of the value being
read, so the loader reports it as ``file:line: field: what was expected``.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import yaml

Path = tuple[str | int, ...]

_BaseLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's event parser: fast


@dataclass(frozen=True, slots=True)
class Limits:
    """What one policy file may hold. Real policies are a few KiB, a few levels deep."""

    max_file_bytes: int = 1 << 20  # 1 MiB
    max_depth: int = 64  # nested mappings and lists
    max_nodes: int = 50_000  # values in one file, every alias counted as what it expands to
    max_scalar_chars: int = 64 * 1024
    max_documents: int = 256
    max_total_bytes: int = 16 << 20  # every file of one policy set together
    max_total_nodes: int = 200_000  # every file of one policy set together


LIMITS = Limits()


@dataclass(slots=True)
class ReadBudget:
    """What is left for one policy set: bytes to read and values to build, over all files."""

    bytes_left: int = LIMITS.max_total_bytes
    nodes_left: int = LIMITS.max_total_nodes


class SourceError(Exception):
    """A file that cannot be read as policy text: ``line`` (0: the whole file) and a reason."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.message = message


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


# ---------------------------------------------------------------------------------------------
# Reading


def _kind_of_file(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def read_source(path: str | os.PathLike[str], limits: Limits = LIMITS,
                total: ReadBudget | None = None) -> str:
    """The text of the regular file ``path`` (symlinks followed), never more than the limit
    (nor more than ``total.bytes_left``, what is left for the whole policy set).

    Raises :class:`SourceError` for anything else: a FIFO, a device, a file over the size
    limit, bytes that are not UTF-8; ``OSError`` when it cannot be opened.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SourceError(0, f"expected a regular file, got {_kind_of_file(st.st_mode)}")
        cap = limits.max_file_bytes
        if st.st_size > cap:
            raise SourceError(0, f"expected a policy file of at most {cap} bytes, "
                                 f"got {st.st_size} bytes")
        if total is not None:
            if st.st_size > total.bytes_left:
                raise SourceError(0, f"expected at most {limits.max_total_bytes} bytes in all "
                                     "policy files together")
            cap = min(cap, total.bytes_left)
        chunks: list[bytes] = []
        got = 0
        while got <= cap:
            chunk = os.read(fd, min(cap + 1 - got, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > cap:
            raise SourceError(0, f"expected a policy file of at most {cap} bytes "
                                 f"(it grew while being read)")
    finally:
        os.close(fd)
    if total is not None:
        total.bytes_left -= got
    data = b"".join(chunks)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise SourceError(line, f"expected UTF-8 text, got byte 0x{data[e.start]:02x} "
                                "(is this a binary file?)") from None


# ---------------------------------------------------------------------------------------------
# Parsing


#: The only tags a scalar may carry: none, the non-specific ``!`` and ``!!str`` (a string stays
#: a string). ``!!binary``, ``!!timestamp``, ``!!float``, ``!!int``, ``!!bool``, ``!!null`` or an
#: application tag would silently turn the text into another type; they are refused.
_SCALAR_TAGS = (None, "!", "tag:yaml.org,2002:str")
_MAP_TAGS = (None, "!", "tag:yaml.org,2002:map")
_SEQ_TAGS = (None, "!", "tag:yaml.org,2002:seq")
_MERGE_TAG = "tag:yaml.org,2002:merge"
_NO_KEY = object()


def _tag_name(tag: str) -> str:
    """``tag:yaml.org,2002:binary`` → ``!!binary``; another tag as written (cut)."""
    short = tag.replace("tag:yaml.org,2002:", "!!", 1)
    return "".join(c if c.isprintable() else "?" for c in short[:60])


def _fail(message: str, mark: Any) -> yaml.MarkedYAMLError:
    return yaml.MarkedYAMLError(problem=message, problem_mark=mark)


@dataclass(slots=True)
class _Frame:
    """A mapping or list under construction."""

    path: Path
    anchor: str | None
    value: Any  # dict or list
    size: int = 1  # values in this subtree, aliases expanded
    key: Any = _NO_KEY  # a mapping's pending key
    key_is_merge: bool = False
    explicit: set[Any] = field(default_factory=set)  # keys written here (not merged in)


class _Composer:
    """Events → plain data for one document, iteratively, within :class:`Limits`."""

    def __init__(self, loader: Any, limits: Limits, budget: list[int], total: ReadBudget) -> None:
        self.loader = loader
        self.limits = limits
        self.budget = budget  # [values left in this file], shared by its documents
        self.total = total  # left for the whole policy set
        self.anchors: dict[str, tuple[Any, int]] = {}
        self.open_anchors: set[str] = set()
        self.lines: dict[Path, int] = {}

    def _charge(self, n: int, mark: Any) -> None:
        self.budget[0] -= n
        self.total.nodes_left -= n
        if self.total.nodes_left < 0:
            raise _fail(f"expected at most {self.limits.max_total_nodes} values in all policy "
                        "files together, aliases counted as what they expand to", mark)
        if self.budget[0] < 0:
            raise _fail(f"expected at most {self.limits.max_nodes} values in one file, aliases "
                        "counted as what they expand to (is this an alias bomb?)", mark)

    def _scalar(self, ev: Any) -> Any:
        if len(ev.value) > self.limits.max_scalar_chars:
            raise _fail(f"expected a value of at most {self.limits.max_scalar_chars} "
                        "characters", ev.start_mark)
        tag = ev.tag
        if tag not in _SCALAR_TAGS:
            raise _fail(f"unsupported tag {_tag_name(tag)}; policy values take no YAML tags "
                        "(a tag changes what the value is: write the value itself)",
                        ev.start_mark)
        if tag is None or tag == "!":
            tag = self.loader.resolve(yaml.ScalarNode, ev.value, ev.implicit)
        if tag == _MERGE_TAG:
            return _MergeKey
        node = yaml.ScalarNode(tag, ev.value, ev.start_mark, ev.end_mark, style=ev.style)
        try:
            value = self.loader.construct_object(node, deep=True)
        except yaml.YAMLError:
            raise
        except Exception as e:  # 5,000-digit ints, bad dates, an empty !!int (IndexError)
            why = str(e).split(":", 1)[0][:100] or type(e).__name__
            raise _fail(f"cannot read this value as {tag.rpartition(':')[2][:40]} ({why})",
                        ev.start_mark) from None
        finally:
            self.loader.constructed_objects.clear()
        return value

    def compose(self) -> Any:
        """Consume one document's events (the DocumentStart is already taken). A problem is a
        ``yaml.MarkedYAMLError`` whose ``path`` names the value being read (the field)."""
        stack: list[_Frame] = []
        try:
            return self._compose(stack)
        except yaml.MarkedYAMLError as e:
            top = stack[-1] if stack else None
            if top is not None and isinstance(top.value, dict) and top.key is _NO_KEY:
                e.path = top.path  # type: ignore[attr-defined]  # a key: its mapping
            else:
                e.path = self._child_path(top)  # type: ignore[attr-defined]
            raise

    def _compose(self, stack: list[_Frame]) -> Any:
        result: Any = None
        while True:
            ev = self.loader.get_event()
            if isinstance(ev, yaml.DocumentEndEvent):
                return result
            mark = ev.start_mark
            line = mark.line + 1
            top = stack[-1] if stack else None
            if isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                done = stack.pop()
                if done.anchor is not None:
                    self.open_anchors.discard(done.anchor)
                    self.anchors[done.anchor] = (done.value, done.size)
                value, size = done.value, done.size
                top = stack[-1] if stack else None
            elif isinstance(ev, yaml.AliasEvent):
                if ev.anchor in self.open_anchors:
                    raise _fail(f"alias *{ev.anchor} refers to its own anchor (a recursive "
                                "alias); expected a finite document", mark)
                if ev.anchor not in self.anchors:
                    raise _fail(f"alias *{ev.anchor} names no anchor defined before it", mark)
                value, size = self.anchors[ev.anchor]
                self._charge(size, mark)
            elif isinstance(ev, yaml.ScalarEvent):
                self._charge(1, mark)
                value, size = self._scalar(ev), 1
                if ev.anchor is not None:
                    self.anchors[ev.anchor] = (value, 1)
            elif isinstance(ev, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                is_map = isinstance(ev, yaml.MappingStartEvent)
                if ev.tag not in (_MAP_TAGS if is_map else _SEQ_TAGS):
                    raise _fail(f"unsupported tag {_tag_name(ev.tag)}; expected a plain "
                                f"{'mapping' if is_map else 'list'}", mark)
                if len(stack) >= self.limits.max_depth:
                    raise _fail(f"expected at most {self.limits.max_depth} levels of nesting",
                                mark)
                if top is not None and isinstance(top.value, dict) and top.key is _NO_KEY:
                    raise _fail("expected a scalar mapping key, got a "
                                f"{'mapping' if is_map else 'list'}", mark)
                self._charge(1, mark)
                path = self._child_path(top)
                self.lines.setdefault(path, line)
                if ev.anchor is not None:
                    self.open_anchors.add(ev.anchor)
                stack.append(_Frame(path, ev.anchor, {} if is_map else []))
                continue
            else:  # pragma: no cover - the parser yields nothing else inside a document
                raise _fail(f"unexpected {type(ev).__name__}", mark)
            if top is None:
                result = value
                self.lines.setdefault((), line)
            else:
                self._attach(top, value, size, mark)

    @staticmethod
    def _child_path(top: _Frame | None) -> Path:
        if top is None:
            return ()
        if isinstance(top.value, list):
            return (*top.path, len(top.value))
        return (*top.path, top.key)

    def _attach(self, top: _Frame, value: Any, size: int, mark: Any) -> None:
        top.size += size
        if isinstance(top.value, list):
            self.lines.setdefault((*top.path, len(top.value)), mark.line + 1)
            top.value.append(value)
            return
        if top.key is _NO_KEY:  # this value is a key
            if value is _MergeKey:
                top.key, top.key_is_merge = "<<", True
                return
            if isinstance(value, (dict, list)):
                raise _fail("expected a scalar mapping key", mark)
            if value in top.explicit:
                raise _fail(f"duplicate key {value!r:.60}", mark)
            top.key, top.key_is_merge = value, False
            top.explicit.add(value)
            top.value.pop(value, None)  # an explicit key overrides a merged one
            self.lines[(*top.path, value)] = mark.line + 1
            return
        key, top.key = top.key, _NO_KEY
        if top.key_is_merge:
            self._merge(top, value, mark)
            return
        top.value[key] = value

    def _merge(self, top: _Frame, value: Any, mark: Any) -> None:
        sources = value if isinstance(value, list) else [value]
        for src in sources:
            if not isinstance(src, dict):
                raise _fail("expected a mapping (or a list of mappings) to merge with <<", mark)
            for k, v in src.items():
                if k not in top.explicit and k not in top.value:
                    top.value[k] = v
                    self.lines.setdefault((*top.path, k), mark.line + 1)


class _MergeKeyType:
    def __repr__(self) -> str:
        return "<<"


_MergeKey = _MergeKeyType()


class _Loader(_BaseLoader):  # type: ignore[misc]
    """libyaml's (or PyYAML's) safe parser, resolver and scalar constructors."""


def load_documents(text: str, file: str, limits: Limits = LIMITS,
                   total: ReadBudget | None = None) -> Iterator[SourceDoc]:
    """Yield every non-empty document of ``text``. Raises ``yaml.YAMLError`` on bad YAML or a
    document over the :class:`Limits` (``total``: what is left for the whole policy set)."""
    total = total if total is not None else ReadBudget(nodes_left=limits.max_total_nodes)
    loader = _Loader(text)
    try:
        budget = [limits.max_nodes]
        loader.get_event()  # StreamStart
        index = 0
        while not loader.check_event(yaml.StreamEndEvent):
            start = loader.get_event()  # DocumentStart
            if index >= limits.max_documents:
                raise _fail(f"expected at most {limits.max_documents} documents in one file",
                            start.start_mark)
            composer = _Composer(loader, limits, budget, total)
            data = composer.compose()
            if data is not None:
                first = composer.lines.get((), start.start_mark.line + 1)
                yield SourceDoc(file, index, data, composer.lines, first)
            index += 1
    finally:
        loader.dispose()
