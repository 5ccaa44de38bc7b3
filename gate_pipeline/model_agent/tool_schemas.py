"""A suite's tools as chat-completions function schemas, built from the suite's own tool catalogue.

The names, argument names, kinds and descriptions come from the suite (`Suite.tools`, each suite's
`tools.py`), so a schema can never drift from what the episode accepts; a model sees the tools of
its episode's suite, and nothing else.
"""
from __future__ import annotations

import inspect
import json
from functools import lru_cache

from ..kernel.suite import Arg, Suite, Tool

PYTHON_KINDS = {"str": str, "strlist": list[str]}


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


# -- the same catalogue as Python functions, for trainers that read a tool from a signature and a docstring --

def tool_docstring(tool: Tool, suite: Suite) -> str:
    """A Google-style docstring: the tool's description, its arguments (an enum as `(choices: [...])`, the
    form transformers' `get_json_schema` reads), and what it returns."""
    lines = [tool.description, ""]
    if tool.args:
        lines.append("Args:")
        for arg in tool.args:
            choices = f" (choices: {json.dumps(list(suite.defect_types))})" if arg.enum == "defect_types" else ""
            lines.append(f"    {arg.name}: {arg.description}{choices}")
        lines.append("")
    lines += ["Returns:", "    The tool's result as JSON text (an object with an error when the call is refused)."]
    return "\n".join(lines)


def as_method(tool: Tool, suite: Suite, call, kind=inspect.Parameter.POSITIONAL_OR_KEYWORD):
    """`call(self, *args, **kwargs)` dressed as the tool: its name, typed parameters (of `kind`) after `self`,
    `-> str`, and `tool_docstring`."""
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    params += [inspect.Parameter(a.name, kind, annotation=PYTHON_KINDS[a.kind]) for a in tool.args]
    call.__signature__ = inspect.Signature(params, return_annotation=str)
    call.__annotations__ = {**{a.name: PYTHON_KINDS[a.kind] for a in tool.args}, "return": str}
    call.__name__ = call.__qualname__ = tool.name
    call.__doc__ = tool_docstring(tool, suite)
    return call
