"""Responses `tools` as the chat path's function tools, and a call's name back as the client knows it.

- `function` tools pass as they are (name, description, parameters, strict);
- `namespace` tools group further tools (OpenAI's; Codex sends `multi_agent_v1` as one): each
  function inside is shown to the model as the chat tool `{namespace}__{name}` (the namespace's
  description before its own). A call of it answers as a `function_call` item with `namespace` and
  the tool's own `name`, as OpenAI answers; a client sends such calls back the same way and they are
  rendered under the joined name again, so the next prompt repeats what the model wrote;
- hosted tools (`HOSTED_TOOLS`: OpenAI runs them, a local model cannot) and `custom` freeform tools
  are dropped from the prompt rather than refused, so clients that always send some (Codex sends
  `web_search`) work: the model is never told of them and never calls them.

Codex's `additional_tools` input items (it sends them instead of `tools` for some models) add their
tools the same way. Any other tool type is a 400 naming it. A bad function tool's 400 names it where
the client wrote it (`tools[4].tools[1].name`), not where the chat request put it (`client_error`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from kvstrata.engine.sampling_params import InvalidRequestError
from kvstrata.serving.errors import quote

NAMESPACE_SEPARATOR = "__"
HOSTED_TOOLS = frozenset({
    "web_search", "web_search_preview", "web_search_preview_2025_03_11", "web_search_2025_08_26", "file_search",
    "code_interpreter", "image_generation", "local_shell", "shell", "apply_patch", "computer_use_preview", "mcp",
    "tool_search", "custom",
})
_CHAT_TOOL_PARAM = re.compile(r"tools\[(\d+)\](?:\.function)?(.*)", re.DOTALL)


def chat_name(namespace: str | None, name: str) -> str:
    """The name the model sees (and writes) for a tool, namespaced or not."""
    return name if namespace is None else f"{namespace}{NAMESPACE_SEPARATOR}{name}"


@dataclass
class ToolSet:
    tools: list[dict[str, Any]] = field(default_factory=list)  # chat tools, in the order written
    origins: list[str] = field(default_factory=list)  # per chat tool: where the client wrote it
    namespaces: dict[str, tuple[str, str]] = field(default_factory=dict)  # chat name -> (namespace, name)

    def add(self, tools: Any, param: str) -> None:
        """Read one list of Responses tools (`param`: where it is in the request)."""
        if not isinstance(tools, list):
            raise InvalidRequestError(f"{param} must be a list of tools", param)
        for i, tool in enumerate(tools):
            self._add_tool(tool, f"{param}[{i}]", None, "")

    def _add_tool(self, tool: Any, param: str, namespace: str | None, preface: str) -> None:
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind == "function":
            name = tool.get("name")
            if not isinstance(name, str):
                raise InvalidRequestError(f"{param}.name must be a string", f"{param}.name")
            fn = {k: tool[k] for k in ("description", "parameters", "strict") if tool.get(k) is not None}
            if preface:
                fn["description"] = f"{preface}\n\n{fn['description']}" if isinstance(fn.get("description"), str) \
                    else preface
            full = chat_name(namespace, name)
            if namespace is not None:
                self.namespaces[full] = (namespace, name)
            self.tools.append({"type": "function", "function": {"name": full, **fn}})
            self.origins.append(param)
        elif kind == "namespace" and namespace is None:
            name, inner = tool.get("name"), tool.get("tools")
            if not isinstance(name, str) or not name:
                raise InvalidRequestError(f"{param}.name must be a non-empty string", f"{param}.name")
            if not isinstance(inner, list):
                raise InvalidRequestError(f"{param}.tools must be a list of function tools", f"{param}.tools")
            description = tool.get("description")
            for j, sub in enumerate(inner):
                self._add_tool(sub, f"{param}.tools[{j}]", name, description if isinstance(description, str) else "")
        elif kind not in HOSTED_TOOLS:
            where = "in a namespace " if namespace is not None else ""
            msg = (f"{param}.type {quote(kind)} is not supported {where}here; send function or namespace tools "
                   f"(hosted tools are ignored: {', '.join(sorted(HOSTED_TOOLS))})")
            raise InvalidRequestError(msg, f"{param}.type", "unsupported")

    def output_name(self, name: str) -> tuple[str | None, str]:
        """(namespace, name) of a call the model wrote as `name`."""
        return self.namespaces.get(name, (None, name))

    def client_error(self, exc: InvalidRequestError) -> InvalidRequestError:
        """A chat 400 on `tools[k].function.x`, naming the tool where the client wrote it
        (`tools[4].tools[1].x`)."""
        found = _CHAT_TOOL_PARAM.fullmatch(exc.param or "")
        if exc.param is None or found is None or int(found.group(1)) >= len(self.origins):
            return exc
        param = self.origins[int(found.group(1))] + found.group(2)
        return InvalidRequestError(exc.message.replace(exc.param, param), param, exc.code)


def request_tools(tools: list[dict[str, Any]] | None, items: str | list[dict[str, Any]]) -> ToolSet:
    """The tools of a request: `tools`, then those of `additional_tools` input items."""
    found = ToolSet()
    if tools is not None:
        found.add(tools, "tools")
    for i, item in enumerate(items if isinstance(items, list) else []):
        if isinstance(item, dict) and item.get("type") == "additional_tools":
            found.add(item.get("tools"), f"input[{i}].tools")
    return found


def chat_tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    """Responses' tool_choice in the chat spelling; a hosted or custom tool cannot be forced."""
    if not isinstance(choice, dict):
        return choice
    kind = choice.get("type")
    if kind == "function" and isinstance(choice.get("name"), str):
        namespace = choice.get("namespace")
        return {"type": "function",
                "function": {"name": chat_name(namespace if isinstance(namespace, str) else None, choice["name"])}}
    if kind in HOSTED_TOOLS:
        raise InvalidRequestError(f"tool_choice cannot force the {quote(kind)} tool: it is not run here; "
                                  "send 'auto' or a function", "tool_choice", "unsupported")
    return choice
