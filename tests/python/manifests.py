"""Validates rendered Kubernetes manifests offline, strictly (unknown fields are errors).

Usage: validate_manifests.py FILE KUBERNETES_VERSION...

Every object of a built-in kind is checked with kubernetes-validate against the OpenAPI
schemas of each Kubernetes version given (it bundles them). ServiceMonitor and PrometheusRule
(monitoring.coreos.com/v1, custom resources) are checked against prometheus-operator's CRD
schemas as the pydantic models of cloudcoil-models-prometheus-operator carry them, made
strict (extra fields forbidden) here. Any other kind is an error. Prints one line per object;
exits non-zero if any object fails.
"""

import inspect
import sys

import kubernetes_validate
import pydantic
import yaml
from cloudcoil.models.prometheus_operator import v1 as monitoring

CUSTOM = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): monitoring.ServiceMonitor,
    ("monitoring.coreos.com/v1", "PrometheusRule"): monitoring.PrometheusRule,
}


def forbid_extra_fields():
    """The generated models ignore unknown fields (pydantic's default): a misspelt field
    would pass. Forbid them on every model of the module, inner models first."""
    models = [
        cls
        for _, cls in inspect.getmembers(monitoring, inspect.isclass)
        if issubclass(cls, pydantic.BaseModel) and cls.__module__ == monitoring.__name__
    ]
    for cls in models:
        cls.model_config["extra"] = "forbid"
    for _ in range(2):
        for cls in models:
            cls.model_rebuild(force=True)


def check_custom(model, document):
    # `metadata` is Kubernetes' ObjectMeta, which the built-in schemas check; the models'
    # version of it is not what is under test.
    body = {key: value for key, value in document.items() if key != "metadata"}
    model.model_validate(body)


def main():
    path, versions = sys.argv[1], sys.argv[2:]
    if not versions:
        sys.exit("name at least one Kubernetes version")
    forbid_extra_fields()
    with open(path, encoding="utf-8") as file:
        documents = [document for document in yaml.safe_load_all(file) if document]
    failures = 0
    for document in documents:
        kind, api = document.get("kind"), document.get("apiVersion")
        name = f"{kind}/{document.get('metadata', {}).get('name')}"
        try:
            if (api, kind) in CUSTOM:
                check_custom(CUSTOM[(api, kind)], document)
                # ObjectMeta checked as a built-in's would be.
                kubernetes_validate.validate(
                    {"apiVersion": "v1", "kind": "ConfigMap", "metadata": document["metadata"]},
                    versions[-1],
                    strict=True,
                )
                print(f"ok {name} (prometheus-operator schema)")
                continue
            for version in versions:
                kubernetes_validate.validate(document, version, strict=True)
            print(f"ok {name} (Kubernetes {', '.join(versions)})")
        except kubernetes_validate.SchemaNotFoundError:
            failures += 1
            print(f"FAIL {name}: no schema for {api} {kind}")
        except (kubernetes_validate.ValidationError, pydantic.ValidationError) as error:
            failures += 1
            message = getattr(error, "message", None) or str(error)
            where = "/".join(str(part) for part in getattr(error, "path", []) or [])
            print(f"FAIL {name}: {where} {message}".replace("\n", " "))
    print(f"{len(documents) - failures} of {len(documents)} objects valid")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
