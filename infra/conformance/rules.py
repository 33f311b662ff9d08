"""The input rules a cloud's API enforces on the resources the program creates, as data.

Pulumi mocks accept any input; the clouds do not. Each cloud keeps, in a module of this package, a
``ResourceRules`` for every resource type the program creates: the physical name (and how Pulumi
makes one when the program gives none), free-text fields, tags or labels, values and the
combinations the API refuses, the order of creation it needs, and which inputs replace the
resource when they change. Every rule names its source.

``violations`` checks a stack's registered resources against them (the conformance tier runs it
on every shipped stack and a matrix of variants); a resource type with no rules is a violation
of its own, so the rules grow with the program.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

# Rule families, each shown to catch a broken input by the conformance tier
# (tests/stack/test_conformance.py reads this list).
NAME = "name"
TEXT = "text"
TAGS = "tags"
VALUE = "value"
COMBINATION = "combination"
ORDER = "order"
UNKNOWN_TYPE = "unknown type"
FAMILIES = (NAME, TEXT, TAGS, VALUE, COMBINATION, ORDER, UNKNOWN_TYPE)

# Pulumi's own resource types (components) go to no cloud.
PROGRAM_TYPE_PREFIX = "llama-rpc-cluster:"
# The characters Pulumi's random name suffixes are drawn from (hex); an example suffix.
RANDOM_CHARACTER = "f"
# How the engine hands a provider a secret input (and a policy pack sees it): this signature key
# beside the value. A rule checks the value itself.
SECRET_SIGNATURE = "4dabf18193072939515e22adb298388d"  # noqa: S105 (a marker, not a secret)


@dataclass(frozen=True)
class Registered:
    """A resource as the program registered it: its type, logical name, inputs (the engine's
    camelCase names) and the resources it waits for, given explicitly (``depends_on``) or
    through its inputs."""

    type: str
    name: str
    inputs: Mapping[str, Any]
    # The keys (``key_of``) of the resources it waits for.
    depends_on: frozenset[str] = frozenset()

    @property
    def key(self) -> str:
        return key_of(self.type, self.name)


def key_of(type_: str, name: str) -> str:
    """A resource's identity in a stack: logical names repeat across types."""
    return f"{type_}::{name}"


@dataclass(frozen=True)
class Stack:
    """Every resource of one program run, and which resource each id belongs to."""

    resources: Sequence[Registered]
    owners: Mapping[str, str] = field(default_factory=dict)  # id -> key

    def find(self, key: str) -> Registered | None:
        return next((r for r in self.resources if r.key == key), None)

    def owner(self, value: Any) -> Registered | None:
        """The stack's resource an id (or ``{"id": ...}``) belongs to, if any."""
        if isinstance(value, Mapping):
            value = value.get("id")
        key = self.owners.get(value) if isinstance(value, str) else None
        return self.find(key) if key else None

    def waits_for(self, resource: Registered, other: Registered) -> bool:
        """Whether ``resource`` is made after ``other``, directly or through others."""
        seen: set[str] = set()
        todo = list(resource.depends_on)
        while todo:
            key = todo.pop()
            if key == other.key:
                return True
            if key in seen:
                continue
            seen.add(key)
            found = self.find(key)
            if found is not None:
                todo.extend(found.depends_on)
        return False


def is_secret(value: Any) -> bool:
    return isinstance(value, Mapping) and SECRET_SIGNATURE in value


def revealed(value: Any) -> Any:
    """An input as given, a secret's value revealed."""
    return value["value"] if is_secret(value) else value


def values_at(inputs: Mapping[str, Any], path: str) -> Iterator[tuple[str, Any]]:
    """(path, value) of each value at a dotted path, ``*`` standing for every item of a list
    or every value of a map, secrets revealed on the way; missing keys give nothing."""
    heads: list[tuple[str, Any]] = [("", inputs)]
    for part in path.split("."):
        found: list[tuple[str, Any]] = []
        for where, value in ((w, revealed(v)) for w, v in heads):
            prefix = f"{where}." if where else ""
            if part == "*":
                items = (
                    value.items()
                    if isinstance(value, Mapping)
                    else enumerate(value)
                    if isinstance(value, list | tuple)
                    else ()
                )
                found += [(f"{prefix}{key}", item) for key, item in items]
            elif isinstance(value, Mapping) and value.get(part) is not None:
                found.append((f"{prefix}{part}", value[part]))
        heads = found
    return iter((where, revealed(value)) for where, value in heads)


class Rule:
    """One rule of a resource type's API. ``problems`` says what breaks it, if anything."""

    family: ClassVar[str]
    source: str

    def problems(self, resource: Registered, stack: Stack) -> Iterator[str]:
        raise NotImplementedError


@dataclass(frozen=True)
class AutoName:
    """How Pulumi names a resource whose name input is not given: the logical name, a
    separator and ``random`` random characters, lowercased where the provider does so. Pulumi
    refuses a result longer than ``max_length`` before anything is created (pulumi/pulumi
    ``NewUniqueName``); it never shortens one."""

    random: int = 7
    separator: str = "-"
    max_length: int | None = 255
    lowercase: bool = False

    def example(self, logical: str) -> str:
        name = f"{logical}{self.separator}{RANDOM_CHARACTER * self.random}"
        return name.lower() if self.lowercase else name


@dataclass(frozen=True)
class Name(Rule):
    """The resource's name in the cloud: given in ``prop``, or made by Pulumi (``autoname``)."""

    family: ClassVar[str] = NAME
    prop: str
    pattern: re.Pattern[str]
    min_length: int
    max_length: int
    meaning: str
    source: str
    # None: Pulumi makes no name and the program must give one.
    autoname: AutoName | None = field(default_factory=AutoName)

    def problems(self, resource: Registered, _stack: Stack) -> Iterator[str]:
        given = resource.inputs.get(self.prop)
        if given is None and self.autoname is None:
            yield f"{self.prop} is not given, and Pulumi makes none"
            return
        if given is None and self.autoname is not None:
            name = self.autoname.example(resource.name)
            limit = self.autoname.max_length
            if limit is not None and len(name) > limit:
                yield (
                    f"Pulumi names it {name!r} ({len(name)} characters) and refuses names over "
                    f"{limit}: shorten the logical name {resource.name!r}"
                )
                return
            how = f"Pulumi names it {name!r}"
        else:
            name, how = str(given), f"{self.prop} {given!r}"
        if not self.min_length <= len(name) <= self.max_length:
            yield f"{how}: {len(name)} characters, outside {self.min_length}-{self.max_length}"
        elif not self.pattern.fullmatch(name):
            yield f"{how}: not {self.meaning}"


@dataclass(frozen=True)
class Text(Rule):
    """A free-text input (a description): its characters and length."""

    family: ClassVar[str] = TEXT
    path: str
    max_length: int
    source: str
    pattern: re.Pattern[str] | None = None
    meaning: str = ""
    required: bool = False  # the API refuses it empty

    def problems(self, resource: Registered, _stack: Stack) -> Iterator[str]:
        found = list(values_at(resource.inputs, self.path))
        if self.required and not found:
            yield f"{self.path} is required"
        for where, value in found:
            text = str(value)
            if len(text) > self.max_length or (self.required and not text):
                yield f"{where} holds {len(text)} characters; the API takes 1-{self.max_length}"
            elif self.pattern is not None and not self.pattern.fullmatch(text):
                bad = sorted({c for c in text if not self.pattern.fullmatch(c)})
                yield f"{where} {text!r} holds {''.join(bad)!r}: {self.meaning}"


@dataclass(frozen=True)
class Tags(Rule):
    """The tags (labels) the resource carries, all of them as the API receives them: the
    cloud's limits on their number, names and values. A type that takes tags carries the
    stack's (``required``), so an audit finds it."""

    family: ClassVar[str] = TAGS
    path: str
    problem: Callable[[Mapping[str, str]], str | None]
    source: str
    required: tuple[str, ...] = ("project", "stack")

    def problems(self, resource: Registered, _stack: Stack) -> Iterator[str]:
        found = [tags for _, tags in values_at(resource.inputs, self.path)]
        if not found or not all(isinstance(tags, Mapping) for tags in found):
            yield f"carries no {self.path}; give it the stack's"
            return
        for tags in found:
            missing = [key for key in self.required if key not in tags]
            if missing:
                yield f"{self.path} lack {', '.join(missing)}"
            problem = self.problem({str(k): str(v) for k, v in tags.items()})
            if problem:
                yield f"{self.path}: {problem}"


@dataclass(frozen=True)
class Between(Rule):
    """A number the API takes only within bounds."""

    family: ClassVar[str] = VALUE
    path: str
    low: float
    high: float
    source: str

    def problems(self, resource: Registered, _stack: Stack) -> Iterator[str]:
        for where, value in values_at(resource.inputs, self.path):
            number = float(value)
            if not self.low <= number <= self.high:
                yield f"{where} is {value}; the API takes {self.low:g}-{self.high:g}"


@dataclass(frozen=True)
class OneOf(Rule):
    """A value the API takes only from a set."""

    family: ClassVar[str] = VALUE
    path: str
    values: tuple[Any, ...]
    source: str

    def problems(self, resource: Registered, _stack: Stack) -> Iterator[str]:
        for where, value in values_at(resource.inputs, self.path):
            if value not in self.values:
                yield f"{where} is {value!r}; the API takes {', '.join(map(repr, self.values))}"


@dataclass(frozen=True)
class Matches(Rule):
    """A value the API takes only in one format (an ARN)."""

    family: ClassVar[str] = VALUE
    path: str
    pattern: re.Pattern[str]
    meaning: str
    source: str

    def problems(self, resource: Registered, _stack: Stack) -> Iterator[str]:
        for where, value in values_at(resource.inputs, self.path):
            if not self.pattern.fullmatch(str(value)):
                yield f"{where} {value!r} is not {self.meaning}"


@dataclass(frozen=True)
class Requires(Rule):
    """A combination of inputs the API refuses (or that breaks a later step): ``check`` returns
    what is wrong, or None."""

    family: ClassVar[str] = COMBINATION
    check: Callable[[Registered, Stack], str | None]
    source: str

    def problems(self, resource: Registered, stack: Stack) -> Iterator[str]:
        problem = self.check(resource, stack)
        if problem:
            yield problem


@dataclass(frozen=True)
class After(Rule):
    """The resource must be made after every resource of these types in the stack (and so be
    deleted before them)."""

    family: ClassVar[str] = ORDER
    types: tuple[str, ...]
    why: str
    source: str

    def problems(self, resource: Registered, stack: Stack) -> Iterator[str]:
        for other in stack.resources:
            if other.type in self.types and not stack.waits_for(resource, other):
                yield f"is not made after {other.name} ({other.type}): {self.why}"


@dataclass(frozen=True)
class OneAtATime(Rule):
    """Resources of this type that write to one parent (the value at ``parent``) must be made
    one after another: the API refuses parallel writes to that parent."""

    family: ClassVar[str] = ORDER
    parent: str
    why: str
    source: str

    def problems(self, resource: Registered, stack: Stack) -> Iterator[str]:
        mine = [value for _, value in values_at(resource.inputs, self.parent)]
        for other in stack.resources:
            if other.type != resource.type or other.name >= resource.name:
                continue
            theirs = [value for _, value in values_at(other.inputs, self.parent)]
            if (
                mine
                and mine == theirs
                and not (stack.waits_for(resource, other) or stack.waits_for(other, resource))
            ):
                yield f"is written at the same time as {other.name}: {self.why}"


@dataclass(frozen=True)
class ResourceRules:
    """Everything the program relies on about one resource type of a cloud's API."""

    type: str
    rules: tuple[Rule, ...]
    # Input paths (dotted, camelCase) whose change makes the provider replace the resource
    # rather than update it; a path covers everything under it.
    replaced_on: tuple[str, ...] = ()
    source: str = ""  # where the replacement behaviour comes from
    # Input paths whose value one live resource alone may hold (a fixed private address): a
    # replacement that keeps the value must delete the old resource first, or the cloud refuses
    # the new one.
    held: tuple[str, ...] = ()
    held_source: str = ""


def create_first_clash(
    entry: ResourceRules,
    before: Mapping[str, Any],
    after: Mapping[str, Any],
    *,
    delete_before_replace: bool,
) -> str | None:
    """Why the cloud refuses this replacement, made create-first (Pulumi's default): the new
    resource asks for a value the old one still holds. None when it deletes first, or keeps
    none."""
    if delete_before_replace:
        return None
    for path in entry.held:
        old = dict(values_at(before, path))
        kept = {where: value for where, value in values_at(after, path) if old.get(where) == value}
        if kept:
            where, value = sorted(kept.items())[0]
            return (
                f"{where} {value!r} is still held by the resource it replaces, and the "
                f"replacement is made first [{entry.held_source}]"
            )
    return None


@dataclass(frozen=True)
class Violation:
    family: str
    type: str
    name: str
    message: str
    source: str

    def __str__(self) -> str:
        return f"{self.name} ({self.type}): {self.message} [{self.family}; {self.source}]"


def by_type(*entries: ResourceRules) -> dict[str, ResourceRules]:
    found: dict[str, ResourceRules] = {}
    for entry in entries:
        if entry.type in found:
            raise ValueError(f"two rule sets for {entry.type}")
        found[entry.type] = entry
    return found


def violations(stack: Stack, rules: Mapping[str, ResourceRules]) -> list[Violation]:
    """Every rule each resource of the stack breaks, and each resource type with no rules."""
    found: list[Violation] = []
    for resource in stack.resources:
        if resource.type.startswith(PROGRAM_TYPE_PREFIX):
            continue
        entry = rules.get(resource.type)
        if entry is None:
            found.append(
                Violation(
                    UNKNOWN_TYPE,
                    resource.type,
                    resource.name,
                    "no input rules are written for this type: add them to its cloud's "
                    "module in infra/conformance/",
                    "",
                )
            )
            continue
        for rule in entry.rules:
            found += [
                Violation(rule.family, resource.type, resource.name, message, rule.source)
                for message in rule.problems(resource, stack)
            ]
    return found


def changed_paths(before: Any, after: Any, path: str = "") -> set[str]:
    """The dotted paths where two input trees differ (a whole list where its length does)."""
    if isinstance(before, Mapping) and isinstance(after, Mapping):
        found: set[str] = set()
        for key in set(before) | set(after):
            found |= changed_paths(before.get(key), after.get(key), f"{path}.{key}".lstrip("."))
        return found
    if isinstance(before, list | tuple) and isinstance(after, list | tuple):
        if len(before) != len(after):
            return {path}
        found = set()
        for i, (old, new) in enumerate(zip(before, after, strict=True)):
            found |= changed_paths(old, new, f"{path}.{i}")
        return found
    return set() if before == after else {path}


def covers(pattern: str, path: str) -> bool:
    """Whether a rule path (with ``*`` for any key or index) covers a changed path."""
    parts, changed = pattern.split("."), path.split(".")
    if len(changed) < len(parts):
        # A list whose length changed is one changed path above its items.
        parts = parts[: len(changed)]
    return all(p in ("*", c) for p, c in zip(parts, changed, strict=False))
