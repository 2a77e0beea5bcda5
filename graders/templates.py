"""Grader templates: `{{ item.<path> }}` and `{{ sample.<path> }}` references in a grader's strings.

OpenAI's graders guide: a string with double curly braces is substituted per item; the only
namespaces are `item` (the data source row) and `sample` (the model's answer: `output_text`,
`output_json` when the answer is JSON, `output_tools`, `choices`). Paths are JSON-path like:
`item.a.b`, `item.list[0].c`. A reference is checked at validation (`check`) against what the
grader will see: the eval's item schema, or the item and sample a run endpoint was sent; a
reference to anything missing is refused there, with its name. `render` substitutes strings as
they are and anything else as compact JSON.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from openft.errors import ECHOED_NAME_CHARS, InvalidRequest

_REFERENCE = re.compile(r"\{\{\s*(.*?)\s*\}\}")
_STEP = re.compile(r"\.([A-Za-z0-9_\-]+)|\[(\d+)\]")
_WHOLE = re.compile(r"(item|sample)((?:\.[A-Za-z0-9_\-]+|\[\d+\])*)")
NAMESPACES = ("item", "sample")
# What the sample namespace holds (OpenAI's guide). output_json is the answer parsed as JSON.
SAMPLE_FIELDS = ("output_text", "output_json", "output_tools", "choices")
_MISSING = object()
MISSING = _MISSING  # what `lookup` answers for a path the value does not hold


@dataclass(frozen=True)
class Reference:
    text: str  # as written between the braces
    namespace: str
    path: tuple[str | int, ...]  # keys and list indices after the namespace


def shown(text: str) -> str:
    """A reference as a message may name it: the caller's own short name, never a long string."""
    return "{{" + text + "}}" if len(text) <= ECHOED_NAME_CHARS else "a reference over 64 characters"


def parse_reference(text: str, param: str) -> Reference:
    match = _WHOLE.fullmatch(text)
    if match is None:
        raise InvalidRequest(f"{param} has {shown(text)}: a template names item.<path> or sample.<path>, a path of "
                             "keys and [indices].", code="invalid_template", param=param)
    path = tuple(m[1] if m[1] is not None else int(m[2]) for m in _STEP.finditer(match[2]))
    head = match[1]
    if head == "sample" and (not path or path[0] not in SAMPLE_FIELDS):
        raise InvalidRequest(f"{param} refers to {shown(text)}; the sample namespace holds "
                             + ", ".join(SAMPLE_FIELDS) + ".", code="invalid_template", param=param)
    if head == "sample" and path[0] == "output_text" and len(path) > 1:
        raise InvalidRequest(f"{param} refers to {shown(text)}; sample.output_text is a string.",
                             code="invalid_template", param=param)
    return Reference(text, head, path)


def references(template: str, param: str) -> list[Reference]:
    return [parse_reference(m[1], param) for m in _REFERENCE.finditer(template)]


@dataclass(frozen=True)
class Scope:
    """What references may name. `item_schema`: a JSON schema of the item (an eval's), or
    `item`: one item (the run endpoint's); neither: item references are not checked. `sample`:
    whether a sample exists at all (an eval without include_sample_schema grades items alone)."""

    item_schema: Mapping | None = None
    item: Any = _MISSING
    sample: bool = True


def check(template: str, param: str, scope: Scope) -> list[Reference]:
    """Every reference of `template`, each checked against `scope`; refuses the first missing one."""
    found = references(template, param)
    for ref in found:
        if ref.namespace == "sample":
            if not scope.sample:
                raise InvalidRequest(f"{param} refers to {shown(ref.text)}, but this eval's items carry no sample: "
                                     "set data_source_config.include_sample_schema to true.",
                                     code="invalid_template", param=param)
            continue
        if scope.item is not _MISSING:
            present = lookup(scope.item, ref.path) is not _MISSING
        elif scope.item_schema is not None:
            present = _schema_has(scope.item_schema, ref.path)
        else:
            present = True
        if not present:
            raise InvalidRequest(f"{param} refers to {shown(ref.text)}, which the item does not have.",
                                 code="invalid_template", param=param)
    return found


def _schema_has(schema: Mapping, path: Iterable[str | int]) -> bool:
    """Whether a JSON schema can hold `path`: named properties, `items` for indices; a schema that
    leaves its properties open (no `properties`, or additionalProperties not false) accepts any key."""
    node: Any = schema
    for step in path:
        if not isinstance(node, Mapping):
            return False
        if isinstance(step, int):
            if node.get("type") not in (None, "array") or "properties" in node:
                return False
            node = node.get("items", {})
            continue
        props = node.get("properties")
        if isinstance(props, Mapping) and step in props:
            node = props[step]
        elif props is None and node.get("type") in (None, "object") and node.get("additionalProperties") is not False:
            node = {}
        elif isinstance(props, Mapping) and node.get("additionalProperties") not in (None, False):
            node = node["additionalProperties"] if isinstance(node["additionalProperties"], Mapping) else {}
        else:
            return False
    return True


def lookup(value: Any, path: Iterable[str | int]) -> Any:
    for step in path:
        if isinstance(step, int) and isinstance(value, list) and -len(value) <= step < len(value):
            value = value[step]
        elif isinstance(step, str) and isinstance(value, Mapping) and step in value:
            value = value[step]
        else:
            return _MISSING
    return value


def sample_namespace(output_text: str, *, output_json: Any = _MISSING, output_tools: list | None = None,
                     choices: list | None = None) -> dict[str, Any]:
    """The sample namespace of one answer; output_json is the text parsed as JSON when it is JSON."""
    if output_json is _MISSING:
        try:
            output_json = json.loads(output_text)
        except ValueError:
            output_json = None
    return {"output_text": output_text, "output_json": output_json, "output_tools": output_tools or [],
            "choices": choices or []}


def render(template: str, sample: Mapping | None, item: Any) -> str:
    """`template` with each reference replaced; a reference that is missing here renders empty
    (validation refused those it could see; an item of a run may still lack an optional key)."""
    parts = _compiled(template)
    if len(parts) == 1 and isinstance(parts[0], str):
        return parts[0]
    scopes = {"item": item, "sample": sample or {}}
    out = []
    for part in parts:
        if isinstance(part, str):
            out.append(part)
            continue
        found = lookup(scopes[part.namespace], part.path)
        if found is not _MISSING and found is not None:
            out.append(found if isinstance(found, str) else json.dumps(found, ensure_ascii=False, separators=(",", ":")))
    return "".join(out)


@functools.lru_cache(maxsize=4096)
def _compiled(template: str) -> tuple[str | Reference, ...]:
    """The template as literal text and parsed references, parsed once per distinct template."""
    parts: list[str | Reference] = []
    pos = 0
    for match in _REFERENCE.finditer(template):
        parts.append(template[pos:match.start()])
        parts.append(parse_reference(match[1], "template"))
        pos = match.end()
    parts.append(template[pos:])
    return tuple(p for p in parts if p != "") or ("",)
