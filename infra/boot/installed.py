"""What a node gets of each file under ``cloud-init/``: the code without its comment lines.

Comments are for the repository; on a node they only take user-data space, of which AWS gives
16 KB compressed. Nothing else changes: shell scripts keep every line bash parses, unindented
(heredoc bodies and multi-line strings as they are; the tests compare bash's own reading of
both), Python scripts lose only their comment tokens, their functions' docstrings and their
module docstring after its first line (the summary their ``--help`` prints; a module they import,
all of it), unit files only their ``#`` and ``;`` lines, and a llama.cpp patch the text before
its diff."""

from __future__ import annotations

import ast
import functools
import io
import re
import tokenize
from collections.abc import Callable
from pathlib import Path

_HEREDOC = re.compile(r"<<-?\s*['\"]?([A-Za-z_][A-Za-z0-9_]*)['\"]?")


def installed_text(path: Path) -> str:
    """The file as a node installs it."""
    return _installed(path.suffix, path.read_text())


# Every node of a stack installs the same few dozen files: each is stripped once per content.
@functools.lru_cache(maxsize=256)
def _installed(suffix: str, text: str) -> str:
    first = text.split("\n", 1)[0]
    # .conf: a unit's drop-in.
    if suffix in {".service", ".target", ".timer", ".conf"}:
        return _without_lines(text, lambda line: line.lstrip().startswith(("#", ";")))
    if suffix == ".patch":  # the diff without what it says about itself
        return patch_diff(text)
    if suffix == ".py":  # a module the scripts import: no --help, no summary
        return _python_without_comments(text, summary=False)
    if first.startswith("#!") and "python" in first:
        return _python_without_comments(text)
    if suffix == ".sh" or (first.startswith("#!") and "bash" in first):
        return _shell_without_comments(text)
    return text


def patch_diff(text: str) -> str:
    """A patch file from its diff on (its first ``--- `` line): what ``git apply`` reads, and
    what the set's digest covers (build-llama.sh reads it the same way)."""
    start = 0 if text.startswith("--- ") else text.find("\n--- ") + 1
    return text[start:]


def _without_lines(text: str, drop: Callable[[str], bool]) -> str:
    return "".join(line for line in text.splitlines(keepends=True) if not drop(line))


def _shell_without_comments(text: str) -> str:
    """Whole-line comments and indentation, outside heredocs and strings that span lines."""
    kept: list[str] = []
    heredoc: str | None = None
    quote: str | None = None
    for number, line in enumerate(text.splitlines(keepends=True)):
        if heredoc is not None:
            kept.append(line)
            if line.strip() == heredoc:
                heredoc = None
            continue
        if number > 0 and quote is None and line.lstrip().startswith("#"):
            continue
        # Indentation is for the reader: bash ignores it outside strings and heredocs.
        kept.append(line if quote is not None else line.lstrip(" \t"))
        quote = _open_quote(line, quote)
        if quote is None and (match := _HEREDOC.search(line.split(" #", 1)[0])):
            heredoc = match.group(1)
    return "".join(kept)


def _open_quote(line: str, quote: str | None) -> str | None:
    """The quote still open at the end of ``line`` (given the one open at its start)."""
    escaped = False
    for char in line:
        if escaped:
            escaped = False
        elif char == "\\" and quote != "'":
            escaped = True
        elif quote is None and char == "#":
            break  # a comment to the end of the line (close enough: tested against bash)
        elif quote is None and char in "'\"":
            quote = char
        elif char == quote:
            quote = None
    return quote


def _python_without_comments(text: str, *, summary: bool = True) -> str:
    """Comment tokens out (the shebang stays); lines left empty by that go too. The module
    docstring keeps its first line; functions and classes lose theirs."""
    text = _first_docstring_line(text, summary=summary)
    comments = {
        token.start[0]: token.start[1]
        for token in tokenize.generate_tokens(io.StringIO(text).readline)
        if token.type == tokenize.COMMENT and token.start[0] > 1
    }
    kept = []
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        if number in comments:
            code = line[: comments[number]].rstrip()
            if code:
                kept.append(code + "\n")
            continue
        kept.append(line)
    return "".join(kept)


def _docstring(node: ast.AST) -> ast.Expr | None:
    """The statement that is the docstring of a module, class or function, if it has one."""
    body = getattr(node, "body", None)
    if not body or not isinstance(body[0], ast.Expr):
        return None
    value = body[0].value
    return body[0] if isinstance(value, ast.Constant) and isinstance(value.value, str) else None


def _first_docstring_line(text: str, *, summary: bool = True) -> str:
    """The module docstring's first line only (none without ``summary``), and no function's or
    class's docstring (a body that was nothing else becomes ``...``)."""
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    cuts: list[tuple[int, int, str]] = []  # (first line, last line, what stands there), 1-based
    module = _docstring(tree)
    if module is not None and module.end_lineno is not None:
        doc = str(module.value.value).strip()  # type: ignore[attr-defined]
        kept = repr(doc.splitlines()[0]) if doc and summary else ""
        cuts.append((module.lineno, module.end_lineno, kept))
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        found = _docstring(node)
        if found is None or found.end_lineno is None or found.lineno == node.lineno:
            continue  # none, or on the line of its `def` (kept as it is)
        alone = len(node.body) == 1
        indent = lines[found.lineno - 1][: found.col_offset]
        cuts.append((found.lineno, found.end_lineno, f"{indent}..." if alone else ""))
    for first, last, instead in sorted(cuts, reverse=True):
        lines[first - 1 : last] = [instead + "\n"] if instead else []
    return "".join(lines)
