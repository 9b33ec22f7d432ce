"""What a JSON schema must satisfy before constrained decoding compiles it (a 400 naming the field).

- OpenAI's size limits, counted over all the schemas of one request (its tools' parameters and its
  response format: they are compiled into one grammar per request): at most `MAX_PROPERTIES`
  object properties, `MAX_NESTING` data levels (properties, items, ...) below a schema's root,
  and `MAX_NAME_CHARS` characters of property names, definition names, enum and const values.
- Every subschema a reply can reach has a finite value. `{"$ref": "#"}`, two definitions that
  refer to each other, or a property that is required to hold its own object describe no JSON
  text at all: the grammar compiler accepts them, and the matcher then dead-ends mid-reply. This
  is grammar productivity, computed as a worklist over AND/OR conditions (linear in the schema):
  a schema is productive when its `$ref` target, its `allOf` members, its required properties and
  the items its `minItems` demands are, and one member of each `anyOf`/`oneOf` is. Recursion
  with a way out (an optional property, `minItems: 0`, an `anyOf` branch) is fine.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvstrata.engine.sampling_params import InvalidRequestError
from kvstrata.serving.errors import quote
from kvstrata.serving.tool_calls.schema_walk import NOT_GENERATED, Node, children, escape, resolve, walk

MAX_PROPERTIES = 5000
MAX_NESTING = 10
MAX_NAME_CHARS = 120_000


@dataclass
class SchemaBudget:
    """What one request's schemas have used of OpenAI's limits so far."""

    properties: int = 0
    name_chars: int = 0

    def check(self, schema: Any, param: str) -> None:
        """400 naming `param` if `schema` breaks a limit or describes no value (see the module docstring)."""
        nodes = walk(schema)
        for node in nodes:
            self._count(node, param)
        _check_productive(nodes, param)

    def _count(self, node: Node, param: str) -> None:
        s = node.schema
        if not isinstance(s, dict):
            return
        if node.level > MAX_NESTING:
            raise InvalidRequestError(f"{param} nests {node.level} levels deep at {quote(node.pointer)}; at most "
                                      f"{MAX_NESTING} are allowed", param)
        props = s.get("properties")
        if isinstance(props, dict):
            self.properties += len(props)
            self.name_chars += sum(len(str(k)) for k in props)
        for key in ("$defs", "definitions"):
            if isinstance(s.get(key), dict):
                self.name_chars += sum(len(str(k)) for k in s[key])
        values = s["enum"] if isinstance(s.get("enum"), list) else []
        values = values + [s["const"]] if "const" in s else values
        self.name_chars += sum(len(v) if isinstance(v, str) else len(repr(v)) for v in values)
        if self.properties > MAX_PROPERTIES:
            raise InvalidRequestError(f"{param}: the request's schemas have more than {MAX_PROPERTIES} properties "
                                      "in all; send smaller schemas", param)
        if self.name_chars > MAX_NAME_CHARS:
            raise InvalidRequestError(f"{param}: the request's schemas have more than {MAX_NAME_CHARS} characters "
                                      "of property names, definition names, enum and const values; shorten them", param)


def _check_productive(nodes: list[Node], param: str) -> None:
    ids = {n.pointer: i for i, n in enumerate(nodes)}
    needs: list[int] = [0] * len(nodes)  # conditions still unmet; a node with none left is productive
    parents: list[list[int]] = [[] for _ in nodes]  # node -> the nodes (AND) waiting on it
    any_of: list[list[int]] = []  # each anyOf/oneOf: its members; satisfied by the first productive one
    owner: list[int] = []  # each anyOf/oneOf -> its node
    member_of: list[list[int]] = [[] for _ in nodes]  # node -> the anyOf/oneOf groups it is a member of
    never: set[int] = set()
    for i, node in enumerate(nodes):
        s = node.schema
        if s is False:
            never.add(i)
            continue
        for child in _required(s, node.pointer, ids):
            needs[i] += 1
            parents[child].append(i)
        for key in ("anyOf", "oneOf"):
            members = [ids[node.pointer + f"/{key}/{k}"] for k in range(len(s.get(key) or []))
                       if node.pointer + f"/{key}/{k}" in ids] if isinstance(s, dict) else []
            if members:
                needs[i] += 1
                for m in members:
                    member_of[m].append(len(any_of))
                any_of.append(members)
                owner.append(i)
    done = [False] * len(nodes)
    met_groups = [False] * len(any_of)
    ready = [i for i in range(len(nodes)) if needs[i] == 0 and i not in never]
    while ready:
        i = ready.pop()
        if done[i]:
            continue
        done[i] = True
        for p in parents[i]:
            needs[p] -= 1
            if needs[p] == 0 and p not in never:
                ready.append(p)
        for g in member_of[i]:
            if not met_groups[g]:
                met_groups[g] = True
                needs[owner[g]] -= 1
                if needs[owner[g]] == 0 and owner[g] not in never:
                    ready.append(owner[g])
    for i in _reachable(nodes, ids):
        if not done[i] and nodes[i].schema is not False:  # `false` only forbids (additionalProperties: false)
            where = quote(nodes[i].pointer or "#")
            raise InvalidRequestError(f"{param} has no finite value at {where}: its $ref (or what it requires) "
                                      "loops back with no way out; give the recursion an optional branch", param)


def _required(s: Any, pointer: str, ids: dict[str, int]) -> list[int]:
    """The subschemas that must all have a value for `s` to have one (its AND conditions)."""
    if not isinstance(s, dict) or "enum" in s or "const" in s:
        return []
    out = []
    target = resolve(s.get("$ref"))
    if target is not None and target in ids:
        out.append(ids[target])
    for k in range(len(s.get("allOf") or [])):
        out += [ids[p] for p in [f"{pointer}/allOf/{k}"] if p in ids]
    props = s.get("properties") if isinstance(s.get("properties"), dict) else {}
    for name in s.get("required") or []:
        if isinstance(name, str) and name in props:
            out += [ids[p] for p in [f"{pointer}/properties/{escape(name)}"] if p in ids]
    need = s.get("minItems")
    if type(need) is int and need > 0:
        prefix = s.get("prefixItems") if isinstance(s.get("prefixItems"), list) else []
        out += [ids[p] for k in range(min(need, len(prefix))) for p in [f"{pointer}/prefixItems/{k}"] if p in ids]
        if need > len(prefix) and f"{pointer}/items" in ids:
            out.append(ids[f"{pointer}/items"])
    return out


def _reachable(nodes: list[Node], ids: dict[str, int]) -> list[int]:
    """The nodes a reply can enter: the root, then children (definitions only through a $ref)."""
    seen, stack = {0}, [0]
    while stack:
        i = stack.pop()
        node = nodes[i]
        nxt = [node.pointer + "".join("/" + escape(t) for t in c.tokens)
               for c in children(node.schema) if c.keyword not in NOT_GENERATED]
        target = resolve(node.schema.get("$ref")) if isinstance(node.schema, dict) else None
        for p in nxt + ([target] if target is not None else []):
            if p in ids and ids[p] not in seen:
                seen.add(ids[p])
                stack.append(ids[p])
    return sorted(seen)
