"""A suite's tools as chat-completions function schemas, built from the suite's own tool catalogue.

The names, argument names, kinds and descriptions come from the suite (`Suite.tools`, each suite's
`tools.py`), so a schema can never drift from what the episode accepts; a model sees the tools of
its episode's suite, and nothing else.
"""
from __future__ import annotations

from functools import lru_cache

from ..kernel.suite import Arg, Suite


def _argument_schema(arg: Arg, suite: Suite) -> dict:
    if arg.kind == "strlist":
        schema: dict = {"type": "array", "items": {"type": "string"}}
    else:
        schema = {"type": "string"}
    if arg.enum == "defect_types":
        schema["enum"] = list(suite.defect_types)
    schema["description"] = arg.description
    return schema


@lru_cache(maxsize=None)
def tool_schemas(suite: Suite) -> list[dict]:
    """The `tools=` list for chat.completions.create, one function per tool of the suite, in its order."""
    return [{"type": "function", "function": {
        "name": tool.name,
        "description": tool.description,
        "parameters": {
            "type": "object",
            "properties": {arg.name: _argument_schema(arg, suite) for arg in tool.args},
            "required": list(tool.arg_names),
            "additionalProperties": False,
        },
    }} for tool in suite.tools]
