"""The JSON schema corpus of the structured-output tests: 30 schemas
covering nested objects, arrays with min/max items, enums, required,
numbers with bounds, string patterns and formats, anyOf and $ref.

Every string is bounded (maxLength, enum, pattern or a fixed-size format;
fractional seconds make time formats unbounded, so they get a maxLength),
every fractional number has a multipleOf (its digits are otherwise
unbounded), and every object is closed (additionalProperties false): the tiny fixture has
random weights, so only the schema bounds how long a sampled string runs,
and an output cut by max_tokens could not be valid.
"""


def s(n=12, **kw):
    return {"type": "string", "maxLength": n, **kw}


def obj(props, required=None, **kw):
    return {
        "type": "object",
        "properties": props,
        "required": list(props) if required is None else required,
        "additionalProperties": False,
        **kw,
    }


SCHEMAS = [
    obj({"name": s()}),
    obj({"age": {"type": "integer", "minimum": 0, "maximum": 120}}),
    obj({"ok": {"type": "boolean"}, "note": s(8)}, required=["ok"]),
    obj({"color": {"enum": ["red", "green", "blue"]}}),
    obj({"score": {"type": "number", "minimum": -1, "maximum": 1, "multipleOf": 0.25}}),
    obj({"tags": {"type": "array", "items": s(6), "minItems": 1, "maxItems": 3}}),
    obj({"point": obj({"x": {"type": "integer", "minimum": -9, "maximum": 9},
                       "y": {"type": "integer", "minimum": -9, "maximum": 9}})}),
    obj({"user": obj({"name": s(10), "address": obj({"city": s(10), "zip": {"type": "string", "pattern": "^[0-9]{5}$"}})})}),
    obj({"date": {"type": "string", "format": "date"}}),
    obj({"when": {"type": "string", "format": "date-time", "maxLength": 25}}),
    obj({"id": {"type": "string", "format": "uuid"}}),
    obj({"ip": {"type": "string", "format": "ipv4"}}),
    obj({"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}}),
    obj({"value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 99}, s(5), {"type": "null"}]}}),
    obj({"shape": {"anyOf": [obj({"kind": {"const": "circle"}, "r": {"type": "number", "minimum": 0, "maximum": 10, "multipleOf": 0.5}}),
                             obj({"kind": {"const": "square"}, "side": {"type": "integer", "minimum": 1, "maximum": 10}})]}}),
    {"$defs": {"item": obj({"sku": {"type": "string", "pattern": "^[a-z]{2}[0-9]{2}$"}, "qty": {"type": "integer", "minimum": 1, "maximum": 9}})},
     **obj({"items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "minItems": 1, "maxItems": 2}})},
    {"$defs": {"name": s(8)}, **obj({"first": {"$ref": "#/$defs/name"}, "last": {"$ref": "#/$defs/name"}})},
    obj({"matrix": {"type": "array", "minItems": 2, "maxItems": 2,
                    "items": {"type": "array", "minItems": 2, "maxItems": 2, "items": {"type": "integer", "minimum": 0, "maximum": 9}}}}),
    obj({"level": {"type": "integer", "enum": [1, 2, 3]}, "label": s(6)}, required=["level"]),
    obj({"a": s(4), "b": s(4), "c": s(4)}, required=["b"]),
    obj({"priority": {"enum": ["low", "medium", "high"]}, "done": {"type": "boolean"},
         "due": {"type": "string", "format": "date"}}),
    obj({"temp": {"type": "number", "exclusiveMinimum": -50, "exclusiveMaximum": 60, "multipleOf": 0.5}, "unit": {"enum": ["C", "F"]}}),
    obj({"list": {"type": "array", "items": {"type": "boolean"}, "maxItems": 4}}),
    obj({"meta": obj({"version": {"type": "string", "pattern": "^[0-9]\\.[0-9]$"}, "beta": {"type": "boolean"}})}),
    obj({"answer": {"enum": ["yes", "no", "maybe"]}, "confidence": {"type": "integer", "minimum": 0, "maximum": 100}}),
    obj({"pair": {"type": "array", "minItems": 2, "maxItems": 2, "items": s(5)}}),
    obj({"opt": {"anyOf": [obj({"n": {"type": "integer", "minimum": 0, "maximum": 5}}), {"type": "null"}]}}),
    obj({"time": {"type": "string", "format": "time", "maxLength": 14}}),
    obj({"people": {"type": "array", "minItems": 1, "maxItems": 2,
                    "items": obj({"name": s(8), "age": {"type": "integer", "minimum": 0, "maximum": 99}})}}),
    obj({"title": s(16), "year": {"type": "integer", "minimum": 1900, "maximum": 2030},
         "genres": {"type": "array", "items": {"enum": ["drama", "comedy", "action"]}, "minItems": 1, "maxItems": 2}}),
]

PROMPTS = [
    "Reply with a JSON object.",
    "Describe a person as JSON.",
    "Give me the data.",
    "Fill in the form.",
    "Output the record now.",
]
