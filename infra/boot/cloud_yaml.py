"""A cloud-config body as YAML: multi-line strings (the scripts, units and patches a node
installs) as literal blocks, so they stay readable in user data.

Every node of a stack carries the same few dozen files, and emitting them is most of a render
(PyYAML's emitter reads and writes each character in Python). The emitter's reading of a scalar
and the text it writes for a block are each made once and replayed: the same bytes as PyYAML's
own emitter, from the same inputs (the scalar and the emitter's state), so no node's user data
changes with them.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Callable
from typing import Any

import yaml
from yaml.emitter import Emitter, ScalarAnalysis

# What a block write leaves behind: its text, the lines it added, and the emitter's column,
# whitespace, indention and open_ended flags after it.
_Written = tuple[str, int, int, bool, bool, bool]
_WRITTEN_KEPT = 512  # blocks kept (a stack's files are a few dozen; each node's own few more)
_written: dict[tuple[Any, ...], _Written] = {}


@functools.lru_cache(maxsize=256)
def _scalar_analysis(scalar: str, allow_unicode: bool) -> ScalarAnalysis:
    return Emitter(io.StringIO(), allow_unicode=allow_unicode).analyze_scalar(scalar)


class _LiteralDumper(yaml.SafeDumper):
    def analyze_scalar(self, scalar: str) -> ScalarAnalysis:
        # PyYAML's own reading, which depends on the scalar and allow_unicode alone.
        return _scalar_analysis(scalar, bool(self.allow_unicode))

    def write_literal(self, text: str) -> None:
        self._replayed(super().write_literal, text)

    def write_double_quoted(self, text: str, split: bool = True) -> None:
        self._replayed(super().write_double_quoted, text, split)

    def _replayed(self, write: Callable[..., None], *args: Any) -> None:
        """``write(*args)`` as PyYAML does it: the text it writes and the state it leaves are a
        function of its arguments and of the emitter's state and settings that it reads."""
        if self.encoding:  # bytes on the stream: written as PyYAML writes them
            write(*args)
            return
        key = (
            write.__name__,
            args,
            self.column,
            self.indent,
            self.whitespace,
            self.indention,
            self.open_ended,
            self.best_indent,
            self.best_width,
            self.best_line_break,
            self.allow_unicode,
        )
        found = _written.get(key)
        if found is None:
            stream, line = self.stream, self.line
            self.stream = io.StringIO()
            try:
                write(*args)
                text = self.stream.getvalue()
            finally:
                self.stream = stream
            found = (text, self.line - line, self.column, self.whitespace, self.indention,
                     self.open_ended)  # fmt: skip
            if len(_written) >= _WRITTEN_KEPT:
                _written.clear()
            _written[key] = found
        text, lines, self.column, self.whitespace, self.indention, self.open_ended = found
        self.line += lines
        self.stream.write(text)


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_LiteralDumper.add_representer(str, _represent_str)


def dump(config: dict[str, Any]) -> str:
    """A cloud-config body as YAML, its scripts as readable literal blocks."""
    return yaml.dump(config, Dumper=_LiteralDumper, sort_keys=False, width=100)
