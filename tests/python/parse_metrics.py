"""Parses a /metrics page with the Prometheus project's own Python parser
(prometheus_client.parser), independently of the crate that wrote it.

    python parse_metrics.py FILE

Prints {"families": {name: type}, "samples": [[name, {label: value}, value], ...]} as JSON;
exits non-zero when the page does not parse."""

import json
import sys

from prometheus_client.parser import text_string_to_metric_families


def main(path):
    with open(path, encoding="utf-8") as file:
        text = file.read()
    families = {}
    samples = []
    for family in text_string_to_metric_families(text):
        if family.name in families:
            raise ValueError(f"the family {family.name} appears twice")
        families[family.name] = family.type
        for sample in family.samples:
            samples.append([sample.name, sample.labels, sample.value])
    print(json.dumps({"families": families, "samples": samples}))


if __name__ == "__main__":
    main(sys.argv[1])
