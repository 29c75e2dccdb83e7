"""Checks of single policy values that need more than a type: label selector grammar, URLs,
signal names, regular expressions and PromQL.

Each check raises ``ValueError`` with what was expected (the schema turns it into a
``file:line: field: ...`` problem) and runs in time bounded by the length of its input, which
the schema caps first. Regular expressions are compiled by RE2 (``google-re2``): it matches in
linear time with no backtracking at all, so a pattern such as ``(a+)+$`` cannot stall the
daemon, and it refuses repeat counts above 1000. PromQL is parsed by ``promql-parser`` (the
Rust parser GreptimeDB uses) after a nesting check, because a very deep expression would
overflow that parser's stack.
"""

from __future__ import annotations

import re
import urllib.parse
from typing import Any

import promql_parser
import re2

MAX_DURATION = 366 * 86400.0  # every duration: at most a year (and a leap day)
MAX_QUANTITY = 1_000_000  # counts of nodes
MAX_REGEX_CHARS = 1024
MAX_PROMQL_CHARS = 4096
MAX_PROMQL_NESTING = 32  # ( [ { open at once
MAX_PROMQL_OPERATORS = 128  # operators (symbols and and/or/unless/atan2) and commas
MAX_URL_CHARS = 2048

#: Signals a job can catch (so it can checkpoint) and Slurm's ``scancel --signal`` knows.
SIGNALS = ("HUP", "INT", "QUIT", "ABRT", "ALRM", "TERM", "USR1", "USR2", "URG", "CONT", "TSTP",
           "TTIN", "TTOU")

# Kubernetes' grammar (apimachinery validation.IsQualifiedName / IsValidLabelValue).
_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_label_key(value: Any) -> str:
    """A Kubernetes label key: ``[prefix/]name``, the prefix a DNS-1123 subdomain (≤ 253), the
    name ≤ 63 of ``A-Z a-z 0-9 - _ .``, starting and ending alphanumeric. Nothing else can get
    into a ``labelSelector`` query (a comma, a space, ``=`` or ``!`` would change it)."""
    expected = ("expected a Kubernetes label key ([prefix/]name: letters, digits, '-', '_', "
                "'.'; a DNS subdomain prefix)")
    if not isinstance(value, str) or len(value) > 317:
        raise ValueError(f"{expected}, got {_shown(value)}")
    prefix, slash, name = value.rpartition("/")
    ok = (len(name) <= 63 and _NAME.fullmatch(name) is not None
          and (not slash or (len(prefix) <= 253
                             and _DNS1123_SUBDOMAIN.fullmatch(prefix) is not None)))
    if not ok:
        raise ValueError(f"{expected}, got {_shown(value)}")
    return value


def check_label_value(value: Any) -> str:
    """A Kubernetes label value: empty, or ≤ 63 of ``A-Z a-z 0-9 - _ .`` starting and ending
    alphanumeric."""
    if not isinstance(value, str) or len(value) > 63 or (
            value and _NAME.fullmatch(value) is None):
        raise ValueError("expected a Kubernetes label value (at most 63 letters, digits, '-', "
                         f"'_', '.'; starting and ending with a letter or digit), got "
                         f"{_shown(value)}")
    return value


_PROM_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]{0,127}")


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]{1,253}")


def _namespaced(value: Any, what: str, *, key: bool) -> tuple[str, str, str]:
    """``NAMESPACE/NAME[:KEY]`` split; raise with what was expected (``what``)."""
    form = "NAMESPACE/NAME[:KEY]" if key else "NAMESPACE/NAME"
    expected = f"expected {form} of {what}"
    if not isinstance(value, str) or len(value) > 600:
        raise ValueError(f"{expected}, got {_shown(value)}")
    ref, colon, k = value.partition(":") if key else (value, "", "")
    ns, slash, name = ref.partition("/")
    if not slash or _DNS_LABEL.fullmatch(ns) is None:
        raise ValueError(f"{expected} (the namespace a lowercase DNS label of at most 63 "
                         f"characters), got {_shown(value)}")
    if len(name) > 253 or _DNS1123_SUBDOMAIN.fullmatch(name) is None:
        raise ValueError(f"{expected} (the name a lowercase DNS subdomain of at most 253 "
                         f"characters), got {_shown(value)}")
    if colon and (_SECRET_KEY.fullmatch(k) is None or k in (".", "..")
                  or k.startswith("..")):
        raise ValueError(f"{expected} (the key at most 253 letters, digits, '-', '_', '.', not "
                         f"'.' and not starting with '..', as Kubernetes allows), got "
                         f"{_shown(value)}")
    return ns, name, k


def check_secret_ref(value: Any) -> str:
    """``NAMESPACE/NAME[:KEY]`` of a Secret as Kubernetes can hold it: a DNS-label namespace,
    a DNS-subdomain name, a valid Secret key (checked here, not when a hook first reads it)."""
    _namespaced(value, "a Secret", key=True)
    return str(value)


def check_configmap_ref(value: Any) -> str:
    """``NAMESPACE/NAME`` of a ConfigMap (a job hook's template)."""
    _namespaced(value, "a ConfigMap holding job.yaml", key=False)
    return str(value)


# An OCI image reference as container runtimes parse it: [host[:port]/]path[:tag][@digest];
# the path's components lowercase, separated by '.', '_', '__' or dashes.
_IMAGE_HOST = (r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*"
               r"[a-zA-Z0-9])?)*|\[[0-9a-fA-F:]+\])(?::[0-9]{1,5})?")
_IMAGE_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_REF = re.compile(
    rf"(?:{_IMAGE_HOST}/)?{_IMAGE_COMPONENT}(?:/{_IMAGE_COMPONENT})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?")


def check_image_ref(value: Any) -> str:
    """A container image reference (``registry.example.com:5000/team/dcgm:4.1``, ``name@sha256:
    …``): what the kubelet would pull, checked at load rather than when a validation Job is
    created in the middle of a remediation."""
    if (not isinstance(value, str) or len(value) > 512
            or _IMAGE_REF.fullmatch(value) is None):
        raise ValueError("expected a container image reference ([registry[:port]/]name[:tag]"
                         f"[@sha256:digest], name in lowercase), got {_shown(value)}")
    repo = value.split("@", 1)[0]
    last = repo.rsplit("/", 1)[-1]
    if ":" in last:  # the tag
        repo = repo[:len(repo) - len(last) + last.index(":")]
    if len(repo) > 255:
        raise ValueError("expected an image name of at most 255 characters (tag aside)")
    return value


def check_prom_label(value: Any) -> str:
    """A Prometheus label name: letters, digits and ``_``, not starting with a digit."""
    if not isinstance(value, str) or _PROM_LABEL.fullmatch(value) is None:
        raise ValueError("expected a Prometheus label name (at most 128 letters, digits, '_'; "
                         f"not starting with a digit), got {_shown(value)}")
    return value


def check_http_url(value: Any) -> str:
    """An absolute ``http(s)://host[:port][/path]`` URL with a host, no credentials in it and no
    whitespace or control character anywhere."""
    if not isinstance(value, str):
        raise ValueError(f"expected an http(s) URL, got {_shown(value)}")
    if len(value) > MAX_URL_CHARS:
        raise ValueError(f"expected a URL of at most {MAX_URL_CHARS} characters")
    if any(ord(c) <= 0x20 or 0x7F <= ord(c) <= 0x9F for c in value):
        raise ValueError(f"expected a URL without spaces or control characters (CR, LF, ...), "
                         f"got {_shown(value)}")
    try:
        u = urllib.parse.urlsplit(value)
        port = u.port  # raises on a port out of range
    except ValueError as e:
        raise ValueError(f"expected an http(s) URL ({e}), got {_shown(value)}") from None
    if u.scheme not in ("http", "https"):
        raise ValueError(f"expected an http(s) URL, got {_shown(value)}")
    if not u.hostname:
        raise ValueError(f"expected a host after {u.scheme}://, got {_shown(value)}")
    if u.username is not None or u.password is not None:
        raise ValueError("expected no credentials in the URL (the hook signs its requests "
                         "with the key in secretRef)")
    if port == 0:
        raise ValueError(f"expected a port between 1 and 65535, got {_shown(value)}")
    return value


def check_signal(value: Any) -> str:
    """A signal name a job can catch, ``USR1`` or ``SIGUSR1``; returned without ``SIG``."""
    if isinstance(value, str) and value.removeprefix("SIG") in SIGNALS:
        return value
    if isinstance(value, str) and value.removeprefix("SIG") in ("KILL", "STOP"):
        raise ValueError(f"expected a signal a job can catch to checkpoint ({', '.join(SIGNALS)})"
                         f"; {value} cannot be caught")
    raise ValueError(f"expected a signal name: one of {', '.join(SIGNALS)} (SIG prefix "
                     f"optional), got {_shown(value)}")


_WORD_OPS = re.compile(r"(?i)\b(?:and|or|unless|atan2)\b")
#: The repeats RE2 reads as repeats: ``{n}``, ``{n,}``, ``{n,m}``, counts without leading zeros
#: and under 10^8 (RE2 reads any other ``{`` as literal text).
_REPEAT = re.compile(r"\{(0|[1-9][0-9]{0,7})(,(0|[1-9][0-9]{0,7})?)?\}")
MAX_REPEAT = 1000  # RE2's own limit


def _shown_brace(pattern: str, i: int) -> str:
    end = pattern.find("}", i, i + 24)
    return pattern[i:end + 1] if end >= 0 else pattern[i:i + 12]


def check_repeats(pattern: str) -> None:
    """Raise ``ValueError`` for a ``{`` outside a character class that RE2 would not read as a
    repeat (``a{,5}``, ``a{ 3}``, ``a{01}``, ``a{4294967296}``, a stray ``{``: RE2 silently
    takes those as literal text, so the rule would never match what its author meant) and for
    a repeat count over :data:`MAX_REPEAT`. A literal brace is written ``\\{``.

    Escapes (``\\{``, ``\\p{Greek}``, ``\\x{263a}``), ``\\Q...\\E`` and character classes
    (``[{]``, ``[[:alpha:]{]``) are skipped as RE2 skips them. Linear in the pattern's length.
    """
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            nxt = pattern[i + 1:i + 2]
            if nxt == "Q":  # quoted text up to \E (or the end)
                end = pattern.find("\\E", i + 2)
                i = n if end < 0 else end + 2
            elif nxt in ("p", "P", "x") and pattern[i + 2:i + 3] == "{":
                end = pattern.find("}", i + 3)
                i = n if end < 0 else end + 1
            else:
                i += 2
            continue
        if c == "[":  # a character class: nothing in it is a repeat
            i += 1
            if pattern[i:i + 1] == "^":
                i += 1
            if pattern[i:i + 1] == "]":  # a leading ] is literal
                i += 1
            while i < n and pattern[i] != "]":
                if pattern[i] == "\\":
                    i += 2
                elif pattern.startswith("[:", i):
                    end = pattern.find(":]", i + 2)
                    i = i + 1 if end < 0 else end + 2
                else:
                    i += 1
            i += 1
            continue
        if c == "{":
            m = _REPEAT.match(pattern, i)
            if m is None:
                raise ValueError(f"expected {_shown_brace(pattern, i)!r} to be a repeat "
                                 "{n}, {n,} or {n,m} (RE2 would read it as literal text; "
                                 "write \\{ for a literal brace)")
            counts = [int(x) for x in (m.group(1), m.group(3)) if x]
            if max(counts) > MAX_REPEAT:
                raise ValueError(f"expected repeat counts of at most {MAX_REPEAT}, got "
                                 f"{m.group(0)[:24]}")
            i = m.end()
            continue
        i += 1


class Re2Pattern:
    """An RE2 regular expression that compares, hashes, prints and pickles by its pattern (the
    daemon loads policies in a child process and compares policy sets)."""

    __slots__ = ("_re", "pattern")

    def __init__(self, pattern: str) -> None:
        options = re2.Options()
        options.log_errors = False  # errors are reported as policy problems, not on stderr
        self._re = re2.compile(pattern, options)
        self.pattern = pattern

    def search(self, text: str) -> Any:
        return self._re.search(text)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Re2Pattern) and other.pattern == self.pattern

    def __hash__(self) -> int:
        return hash(("re2", self.pattern))

    def __repr__(self) -> str:
        return f"re2.compile({self.pattern!r})"

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (Re2Pattern, (self.pattern,))


def compile_regex(pattern: str) -> Re2Pattern:
    """``pattern`` compiled by RE2 (linear-time matching, no backtracking).

    Refused: more than :data:`MAX_REGEX_CHARS` characters, a brace RE2 would not read as a
    repeat or a repeat count above 1000 (:func:`check_repeats`: RE2 reads an overflowing
    ``a{4294967296}`` as literal text), what RE2 cannot do in linear time (backreferences,
    lookaround) and programs over RE2's memory budget.
    """
    if len(pattern) > MAX_REGEX_CHARS:
        raise ValueError(f"expected a regular expression of at most {MAX_REGEX_CHARS} characters")
    check_repeats(pattern)
    try:
        return Re2Pattern(pattern)
    except re2.error as e:
        why = e.args[0].decode("utf-8", "replace") if e.args and isinstance(
            e.args[0], bytes) else str(e)
        raise ValueError(f"expected a regular expression in RE2 syntax (no backreferences or "
                         f"lookaround; repeats ≤ 1000): {why[:120]}") from None


def check_promql(expr: str) -> Any:
    """Parse ``expr`` as PromQL and return its tree; raise ``ValueError`` with the parser's
    reason if it is not PromQL.

    Nesting and operator counts are checked first (with strings skipped), so the parser never
    sees an expression deep enough to overflow its stack.
    """
    if len(expr) > MAX_PROMQL_CHARS:
        raise ValueError(f"expected a PromQL expression of at most {MAX_PROMQL_CHARS} characters")
    depth = worst = ops = 0
    quote = ""
    escaped = False
    outside: list[str] = []  # the text outside string literals
    for c in expr:
        if not quote:
            outside.append(c)
        if quote:
            if escaped:
                escaped = False
            elif c == "\\" and quote != "`":
                escaped = True
            elif c == quote:
                quote = ""
            continue
        if c in "\"'`":
            quote = c
        elif c in "([{":
            depth += 1
            worst = max(worst, depth)
        elif c in ")]}":
            depth -= 1
        elif c in "+-*/%^,<>=!":
            ops += 1
    ops += len(_WORD_OPS.findall("".join(outside)))
    if worst > MAX_PROMQL_NESTING:
        raise ValueError(f"expected a PromQL expression nested at most {MAX_PROMQL_NESTING} "
                         "deep")
    if ops > MAX_PROMQL_OPERATORS:
        raise ValueError(f"expected a PromQL expression of at most {MAX_PROMQL_OPERATORS} "
                         "operators")
    try:
        return promql_parser.parse(expr)
    except Exception as e:  # the binding raises ValueError, but a parser bug must not escape
        raise ValueError(f"expected a PromQL expression that parses: {str(e)[:160]}") from None
