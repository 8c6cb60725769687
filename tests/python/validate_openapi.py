"""Checks OpenAPI documents with independent tools: a strict parse that fails on a key given
twice in one object (JSON or YAML) and openapi-spec-validator.

    python validate_openapi.py FILE...

Prints one line per document and exits non-zero at the first problem."""

import json
import sys

import yaml
from openapi_spec_validator import validate


def strict_pairs(pairs):
    seen = set()
    for key, _ in pairs:
        if key in seen:
            raise ValueError(f"the key {key!r} appears twice in one object")
        seen.add(key)
    return dict(pairs)


class StrictLoader(yaml.SafeLoader):
    """A YAML loader that refuses a key given twice in one mapping."""


def strict_mapping(loader, node, deep=False):
    pairs = [
        (loader.construct_object(key, deep=deep), loader.construct_object(value, deep=deep))
        for key, value in node.value
    ]
    return strict_pairs(pairs)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, strict_mapping)


def load(path):
    with open(path, encoding="utf-8") as file:
        text = file.read()
    if path.endswith((".yaml", ".yml")):
        return yaml.load(text, Loader=StrictLoader)
    return json.loads(text, object_pairs_hook=strict_pairs)


def main(paths):
    for path in paths:
        document = load(path)
        validate(document)
        operations = sum(len(item) for item in document["paths"].values())
        print(f"{path}: valid OpenAPI {document['openapi']}, {len(document['paths'])} paths, {operations} operations")


if __name__ == "__main__":
    main(sys.argv[1:])
