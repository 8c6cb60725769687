"""Rendered Kubernetes manifests (`kubectl kustomize` output), for tests/tests/manifests.rs and
kube_play.rs.

    manifests.py validate VERSION[,VERSION...] FILE...
        Validates every object of every FILE offline and strictly (unknown fields are
        errors): built-in kinds with kubernetes-validate against the schemas of each
        Kubernetes version given (it bundles them); ServiceMonitor and PrometheusRule
        (monitoring.coreos.com/v1) against prometheus-operator's CRD schemas as
        cloudcoil-models-prometheus-operator carries them, made strict here. Any other kind
        fails. One line per object ("ok FILE Kind/name" or "FAIL FILE Kind/name: why"); exit
        1 on a failure. (One process for many files: loading the models takes seconds.)
    manifests.py rules FILE OUT
        Writes the PrometheusRule's groups to OUT, a rule file for promtool.
    manifests.py facts FILE
        Prints, as JSON, what the tests check of each Deployment and StatefulSet: its
        replicas, grace period, preStop sleep, probes, command, and the environment variable
        names its containers get (env and the keys of envFrom ConfigMaps and Secrets), with
        the ConfigMaps' data.
    manifests.py play FILE OUTDIR
        Prepares FILE for podman 4.3's `kube play`: OUTDIR/play.yaml holds every document
        but the Secrets, and OUTDIR/secret-NAME.json each Secret as the JSON map of base64
        values `podman secret create` takes. Prints the Secrets' values as JSON.
"""

import base64
import inspect
import json
import os
import sys

import yaml


def documents(path):
    with open(path, encoding="utf-8") as file:
        return [document for document in yaml.safe_load_all(file) if document]


def name_of(document):
    return f"{document.get('kind')}/{document.get('metadata', {}).get('name')}"


def validate(versions, paths):
    import kubernetes_validate
    import pydantic
    from cloudcoil.models.prometheus_operator import v1 as monitoring

    # The generated models ignore unknown fields (pydantic's default), so a misspelt field
    # would pass: forbid them on every model of the module.
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
    custom = {
        ("monitoring.coreos.com/v1", "ServiceMonitor"): monitoring.ServiceMonitor,
        ("monitoring.coreos.com/v1", "PrometheusRule"): monitoring.PrometheusRule,
    }
    failures = 0
    objects = [(os.path.basename(path), document) for path in paths for document in documents(path)]
    for path, document in objects:
        kind, api = document.get("kind"), document.get("apiVersion")
        name = f"{path} {name_of(document)}"
        try:
            if (api, kind) in custom:
                # The spec against the CRD's schema; metadata (ObjectMeta) as a built-in's.
                body = {key: value for key, value in document.items() if key != "metadata"}
                custom[(api, kind)].model_validate(body)
                meta = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": document["metadata"]}
                kubernetes_validate.validate(meta, versions[-1], strict=True)
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
    print(f"{len(objects) - failures} of {len(objects)} objects valid")
    return 1 if failures else 0


def rules(path, out):
    found = [d for d in documents(path) if d.get("kind") == "PrometheusRule"]
    if len(found) != 1:
        sys.exit(f"expected one PrometheusRule, found {len(found)}")
    with open(out, "w", encoding="utf-8") as file:
        yaml.safe_dump(found[0]["spec"], file, sort_keys=False)
    return 0


def facts(path):
    objects = documents(path)
    data = {}
    for document in objects:
        if document.get("kind") in ("ConfigMap", "Secret"):
            keys = dict(document.get("data") or {})
            keys.update(document.get("stringData") or {})
            data[name_of(document)] = keys
    workloads = []
    for document in objects:
        if document.get("kind") not in ("Deployment", "StatefulSet"):
            continue
        pod = document["spec"]["template"]["spec"]
        containers = []
        for container in pod["containers"]:
            variables = container.get("env") or []
            # A variable only there to be spelt into another's value (`$(POD_IP)`), which
            # Kubernetes does, is not a setting of the binary.
            spelt = {
                variable["name"]
                for variable in variables
                if any(f"$({variable['name']})" in str(other.get("value", "")) for other in variables)
            }
            env = [variable["name"] for variable in variables if variable["name"] not in spelt]
            for source in container.get("envFrom") or []:
                for kind, ref in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
                    if ref in source:
                        env.extend(data.get(f"{kind}/{source[ref]['name']}", {}))
            pre_stop = (((container.get("lifecycle") or {}).get("preStop") or {}).get("exec") or {})
            command = pre_stop.get("command") or []
            containers.append(
                {
                    "name": container["name"],
                    "command": container.get("command") or [],
                    "env": sorted(set(env)),
                    "readiness": ((container.get("readinessProbe") or {}).get("httpGet") or {}).get("path"),
                    "liveness": ((container.get("livenessProbe") or {}).get("httpGet") or {}).get("path"),
                    "startup": ((container.get("startupProbe") or {}).get("httpGet") or {}).get("path"),
                    # How long a start may take before the kubelet restarts the container
                    # (Kubernetes' defaults: a 10 s period, 3 failures).
                    "startup_seconds": (container.get("startupProbe") or {}).get("periodSeconds", 10)
                    * (container.get("startupProbe") or {}).get("failureThreshold", 3),
                    "pre_stop_sleep": int(command[1]) if command[:1] == ["sleep"] else 0,
                }
            )
        workloads.append(
            {
                "kind": document["kind"],
                "name": document["metadata"]["name"],
                "replicas": document["spec"].get("replicas", 1),
                "grace": pod.get("terminationGracePeriodSeconds", 30),
                "containers": containers,
            }
        )
    json.dump({"workloads": workloads, "data": data}, sys.stdout)
    return 0


def play(path, outdir):
    os.makedirs(outdir, exist_ok=True)
    kept, secrets = [], {}
    for document in documents(path):
        if document.get("kind") != "Secret":
            kept.append(yaml.safe_dump(document, sort_keys=False))
            continue
        name = document["metadata"]["name"]
        values = {key: base64.b64decode(value).decode() for key, value in (document.get("data") or {}).items()}
        values.update(document.get("stringData") or {})
        secrets[name] = values
        encoded = {key: base64.b64encode(value.encode()).decode() for key, value in values.items()}
        with open(os.path.join(outdir, f"secret-{name}.json"), "w", encoding="utf-8") as file:
            json.dump(encoded, file)
    with open(os.path.join(outdir, "play.yaml"), "w", encoding="utf-8") as file:
        file.write("---\n".join(kept))
    json.dump(secrets, sys.stdout)
    return 0


def main():
    command, arguments = sys.argv[1], sys.argv[2:]
    if command == "validate" and len(arguments) >= 2:
        return validate(arguments[0].split(","), arguments[1:])
    if command == "rules" and len(arguments) == 2:
        return rules(*arguments)
    if command == "facts" and len(arguments) == 1:
        return facts(*arguments)
    if command == "play" and len(arguments) == 2:
        return play(*arguments)
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main())
