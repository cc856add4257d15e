"""A data set's tools as OpenAI-style function schemas (``prompt.tools=schemas``, e.g. ``prompt=json_tools``).

Every schema is ``{"type": "function", "function": {"name", "description", "parameters": <JSON schema>}}``,
the form chat templates take as ``apply_chat_template(..., tools=[...])``. It is derived from an
:class:`~mice_exp.data.records.Example`'s ``tools`` text, the one place a data set keeps its tools, so
every loader (STE, BFCL, jsonl, the gate's queries) gets it without a second copy:

* STE-style text, one ``API_name: <name>`` / ``Description: ...`` block per tool: STE's RapidAPI
  descriptions (a JSON object with ``required_parameters`` and ``optional_parameters``, each with a
  RapidAPI type: STRING, NUMBER, ENUM, ...) and its hand-written ones ("... Your input should be a json
  (args json schema): {{"date" : string, "days" : integer, }} The Action to trigger this API ...",
  every listed argument required);
* a JSON list of function objects: BFCL's (``{"name", "description", "parameters"}`` with BFCL's Python-ish
  types, "dict" -> "object", "float" -> "number", "tuple" -> "array", as BFCL's own ``GORILLA_TO_OPENAPI``;
  "any" leaves the type out, which in JSON schema means any value), a jsonl file's or a gate query's (whose
  ``parameters`` may be the short form ``{argument: type}``), or ones already in OpenAI's form.
"""

from __future__ import annotations

import json
import re
from typing import Any

from jsonschema.exceptions import SchemaError
from jsonschema.validators import validator_for

from mice_exp.errors import UserError

Schema = dict[str, Any]

#: BFCL's parameter types -> JSON schema types (bfcl_eval/constants/type_mappings.py: GORILLA_TO_OPENAPI,
#: except "any", left untyped rather than called a string). JSON schema's own names map to themselves.
JSON_TYPES = {
    "integer": "integer", "number": "number", "float": "number", "double": "number", "string": "string",
    "char": "string", "String": "string", "boolean": "boolean", "bool": "boolean", "array": "array", "list": "array",
    "tuple": "array", "ArrayList": "array", "Array": "array", "Queue": "array", "Stack": "array", "dict": "object",
    "object": "object", "HashMap": "object", "Hashtable": "object", "byte": "integer", "short": "integer",
    "long": "integer", "Bigint": "integer", "null": "null",
}
#: RapidAPI's parameter types in STE's descriptions (STRING 41, string 5, NUMBER 3, ENUM 1 in its test set;
#: an ENUM lists no values, so it is a string).
RAPIDAPI_TYPES = {"string": "string", "enum": "string", "number": "number", "integer": "integer",
                  "boolean": "boolean", "array": "array", "object": "object"}

_NAME_LINE = re.compile(r"^API_name:\s*(.+?)\s*$", re.MULTILINE)
_DESCRIPTION = re.compile(r"\ADescription:\s*", re.MULTILINE)
_ARGS = re.compile(r"Your input should be a json \(args json schema\): \{\{(.*?)\}\}")
_ARG = re.compile(r'"([^"]+)"\s*:\s*(\w+)')
_TRIGGER = re.compile(r"\s*The Action to trigger this API should be .*\Z", re.DOTALL)


def function_schema(name: str, description: str, parameters: Schema) -> Schema:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def object_schema(properties: dict[str, Schema], required: list[str]) -> Schema:
    return {"type": "object", "properties": properties, "required": required}


def tool_schemas(tools: str, where: str) -> list[Schema]:
    """The schemas of an Example's ``tools`` text (``where`` names it in an error)."""
    if tools.lstrip().startswith("["):
        try:
            functions = json.loads(tools)
        except json.JSONDecodeError as error:
            raise UserError(f"{where}: its tools are not valid JSON ({error.msg}); expected a list of functions") from None
        return [function_of(f, where) for f in functions]
    starts = list(_NAME_LINE.finditer(tools))
    if not starts:
        raise UserError(f"{where}: its tools are free text without 'API_name:' lines; prompt.tools=schemas expects "
                        "a list of function objects or STE-style 'API_name: / Description:' blocks")
    ends = [m.start() for m in starts[1:]] + [len(tools)]
    return [ste_schema(m.group(1), tools[m.end():end].strip()) for m, end in zip(starts, ends)]


def ste_schema(name: str, body: str) -> Schema:
    """One STE tool (``body``: the text after its ``API_name:`` line) as a function schema."""
    description = _DESCRIPTION.sub("", body, count=1)
    if description.startswith("{"):
        try:
            return rapidapi_schema(name, json.loads(description))
        except (json.JSONDecodeError, KeyError, TypeError):
            pass  # not RapidAPI's form after all: read as hand-written text
    found = _ARGS.search(description)
    arguments = _ARG.findall(found.group(1)) if found else []
    text = _TRIGGER.sub("", _ARGS.sub("", description)).strip().replace("{{", "{").replace("}}", "}")
    properties = {arg: {"type": RAPIDAPI_TYPES.get(kind.lower(), "string")} for arg, kind in arguments}
    return function_schema(name, text, object_schema(properties, list(properties)))


def rapidapi_schema(name: str, spec: dict[str, Any]) -> Schema:
    """An STE description in RapidAPI's form: its parameters with their types, descriptions and defaults;
    the parent tool's description follows the endpoint's, as STE's text shows both."""
    properties: dict[str, Schema] = {}
    for param in spec["required_parameters"] + spec["optional_parameters"]:
        kind = RAPIDAPI_TYPES.get(str(param["type"]).lower(), "string")
        prop: Schema = {"type": kind, "description": param.get("description", "")}
        default = _typed_default(param.get("default", ""), kind)
        if default is not None:
            prop["default"] = default
        properties[param["name"]] = prop
    parent = spec.get("parent_tool_description")
    parts = [spec.get("description", "").strip()] + ([f"({spec['parent_tool_name']}: {parent.strip()})"] if parent else [])
    required = [p["name"] for p in spec["required_parameters"]]
    return function_schema(name, " ".join(p for p in parts if p), object_schema(properties, required))


def _typed_default(value: Any, kind: str) -> Any:
    """A RapidAPI default (always a string) as a value of its type; None where there is none or it does not fit."""
    if value in ("", None):
        return None
    if kind not in ("number", "integer"):
        return value
    try:
        number = json.loads(value) if isinstance(value, str) else value
    except json.JSONDecodeError:
        return None
    return number if isinstance(number, (int, float)) and not isinstance(number, bool) else None


def function_of(function: Any, where: str) -> Schema:
    """A function object (BFCL's, a jsonl file's or already OpenAI's) as a function schema; parameters that are no
    object schema are refused in one line, by the check the gate's API applies to a request's tools."""
    if isinstance(function, dict) and function.get("type") == "function" and isinstance(function.get("function"), dict):
        function = function["function"]
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise UserError(f"{where}: a tool is {function!r}; expected an object with a string 'name'")
    parameters = function.get("parameters") or {}
    if isinstance(parameters, dict) and "type" not in parameters and "properties" not in parameters:
        # the short form {argument: type or spec}
        parameters = object_schema({k: {"type": v} if isinstance(v, str) else v for k, v in parameters.items()}, [])
    parameters = json_schema(parameters)
    problem = object_schema_problem(parameters)
    if problem:
        raise UserError(f"{where}: tool {function['name']!r}: {problem}; expected 'parameters' to be an object schema "
                        '{"type": "object", "properties": {argument: schema}, "required": [argument, ...]} or the '
                        "short form {argument: type}")
    return function_schema(function["name"], str(function.get("description", "")), parameters)


def object_schema_problem(parameters: Any) -> str | None:
    """What makes ``parameters`` no JSON object schema whose ``required`` names its properties (None: nothing)."""
    if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
        return f"{json.dumps(parameters)[:80]} is not a JSON schema of type 'object'"
    properties = parameters.get("properties", {})
    if not isinstance(properties, dict) or not all(isinstance(p, dict) for p in properties.values()):
        return "'properties' must map each argument name to a schema object"
    required = parameters.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        return "'required' must be a list of argument names"
    unknown = [r for r in required if r not in properties]
    if unknown:
        return f"'required' names {unknown[0]!r}, which is not in 'properties'"
    try:
        validator_for(parameters).check_schema(parameters)
    except SchemaError as error:
        where = "".join(f"[{json.dumps(p)}]" for p in error.absolute_path)
        return f"parameters{where}: {error.message}"
    return None


def json_schema(spec: Any) -> Any:
    """A BFCL parameter spec with its types in JSON schema's names, recursively; every other key kept."""
    if not isinstance(spec, dict):
        return spec
    out = {}
    for key, value in spec.items():
        if key == "type" and isinstance(value, str):
            if value in ("any", "Any"):
                continue  # JSON schema: no type, any value
            out[key] = JSON_TYPES.get(value, value)
        elif key == "properties" and isinstance(value, dict):
            out[key] = {name: json_schema(prop) for name, prop in value.items()}
        elif key == "items":
            out[key] = json_schema(value)
        else:
            out[key] = value
    return out


def _optional(prop: Schema) -> Schema:
    """``{"anyOf": [X, {"type": "null"}], ...}`` as X with the other keys (an optional parameter of X's type)."""
    options = prop.get("anyOf")
    if not isinstance(options, list) or len(options) != 2 or {"type": "null"} not in options:
        return prop
    (kept,) = [o for o in options if o != {"type": "null"}]
    return {k: v for k, v in prop.items() if k != "anyOf"} | kept if isinstance(kept, dict) else prop


#: What STE's RapidAPI form shows of a parameter (``title``, which pydantic adds, is dropped).
RAPIDAPI_KEYS = frozenset({"type", "description", "default", "title"})
_HANDWRITTEN = ("{description} {arguments} The Action to trigger this API should be {name} and the input parameters "
                "should be a json dict string. Pay attention to the type of parameters.")


def ste_text(schema: Schema) -> str:
    """A function schema as one STE ``API_name: / Description:`` block, the inverse of :func:`ste_schema`: how a
    gate trained under ``prompt.tools=text`` (``prompt=ste``) is shown a tool given as a schema. A tool whose
    parameters are all required and typed only gets STE's hand-written form (STE's own such tools come back
    word for word), any other RapidAPI's form. A parameter neither form can show (an ``enum``, nested
    ``properties`` or ``items``, no single JSON type) is a UserError saying so, rather than a prompt that
    silently drops it. A parameter that may be null, as pydantic and the agent SDKs write ``x: int | None =
    None`` (``anyOf`` of one type and ``null``; the Agents SDK's strict schemas list it as required), is
    RapidAPI's optional parameter of that type (null and absent alike: no value given)."""
    function = schema["function"]
    parameters = function.get("parameters") or {}
    given = parameters.get("properties") or {}
    properties = {name: _optional(prop) for name, prop in given.items()}
    required = {r for r in parameters.get("required") or [] if r not in given or properties[r] is given[r]}
    for name, prop in properties.items():
        kind = prop.get("type", "string")
        extra = sorted(set(prop) - RAPIDAPI_KEYS)
        if extra or not isinstance(kind, str) or kind not in RAPIDAPI_TYPES:
            what = f"{extra[0]!r}" if extra else f"type {kind!r}"
            raise UserError(f"tool {function['name']!r}: parameter {name!r} has {what}, which STE's text form cannot "
                            "show; the gate was trained on prompt=ste and needs prompt=json_tools for schema tools "
                            "like this one")
    description = function.get("description", "")
    if set(properties) == required and all(set(p) == {"type"} for p in properties.values()):
        arguments = "".join(f'"{name}" : {prop["type"]}, ' for name, prop in properties.items())
        shown = _HANDWRITTEN.format(description=description.replace("{", "{{").replace("}", "}}"), name=function["name"],
                                    arguments=f"Your input should be a json (args json schema): {{{{{arguments}}}}}"
                                    if arguments else "")
        return f"API_name: {function['name']}\nDescription: {shown}"
    listed: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    for name, prop in properties.items():
        listed[name in required].append({
            "name": name, "type": prop.get("type", "string").upper(), "description": str(prop.get("description", "")),
            "default": "" if prop.get("default") is None else prop["default"]})  # as STE's files write them
    spec = {"description": description, "required_parameters": listed[True], "optional_parameters": listed[False]}
    return f"API_name: {function['name']}\nDescription: {json.dumps(spec, ensure_ascii=False)}"
