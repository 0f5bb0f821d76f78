"""Checks charts/berth offline with the real Helm SDK (PyPI helm-python-sdk): lint and render
with the chart's defaults and with non-default values, every rendered manifest validated
against Kubernetes' schemas (PyPI kubernetes-validate, strict), and the Prometheus operator's
kinds, for which it has no schemas, against the shape of their CRDs. With --out DIR it also
writes each case's manifests there (DIR/CASE/NAME.yaml) for the tests to read.

Run through scripts/check-chart, which finds the virtualenv scripts/setup-test-deps made."""

import argparse
import copy
import pathlib
import sys

import helm_python as helm
import jsonschema
import kubernetes_validate
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "berth"
KUBERNETES_VERSION = "1.30.0"

# What the chart cannot run without: the LXD endpoint and the two Secrets.
REQUIRED = {
    "lxd": {"endpoint": "https://lxd.example:8443", "secretName": "berth-lxd"},
    "tls": {"secretName": "berth-tls"},
}

NON_DEFAULT = {
    "nameOverride": "workspaces",
    "image": {"repository": "registry.example/berth", "tag": "0.1.0-test", "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "registry"}],
    "lxd": {
        "endpoint": "https://lxd.example:8443",
        "secretName": "lxd-client",
        "project": "agents",
        "storagePool": "fast",
        "target": "@workers",
    },
    "tls": {"secretName": "berth-api-tls"},
    "config": {
        "defaults": {"image": "berth-agents", "reap": {"idleAfter": "2h", "idleAction": "Stop"}},
        "scheduler": {"interval": "1m", "workers": 4},
        "trash": {"retention": "14d"},
        "previewDomain": "preview.example",
    },
    "logLevel": "berth=debug,info",
    "persistence": {"existingClaim": "berth-data"},
    "service": {"type": "NodePort", "port": 8443, "annotations": {"example/owner": "platform"}},
    "podAnnotations": {"example/scrape": "true"},
    "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "2Gi"}},
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "berth", "effect": "NoSchedule"}],
    "serviceMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "prometheus"}},
    "prometheusRule": {"enabled": True, "labels": {"release": "prometheus"}},
}

CASES = {"default": REQUIRED, "non-default": NON_DEFAULT}

# The fields of the Prometheus operator's CRDs (monitoring.coreos.com/v1) this chart may set,
# with their types; anything else is refused, as a typo would be silently ignored by a cluster.
_STR = {"type": "string"}
_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
_DURATION = {"type": "string", "pattern": "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}
_METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {"name": _STR, "namespace": _STR, "labels": _LABELS, "annotations": _LABELS},
}
_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"matchLabels": _LABELS, "matchExpressions": {"type": "array"}},
}
SERVICE_MONITOR = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": _METADATA,
        "spec": {
            "type": "object",
            "required": ["selector"],
            "additionalProperties": False,
            "properties": {
                "jobLabel": _STR,
                "targetLabels": {"type": "array", "items": _STR},
                "podTargetLabels": {"type": "array", "items": _STR},
                "selector": _SELECTOR,
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"any": {"type": "boolean"}, "matchNames": {"type": "array", "items": _STR}},
                },
                "endpoints": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": _STR,
                            "targetPort": {"type": ["string", "integer"]},
                            "path": _STR,
                            "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
                            "params": {"type": "object"},
                            "interval": _DURATION,
                            "scrapeTimeout": _DURATION,
                            "honorLabels": {"type": "boolean"},
                            "honorTimestamps": {"type": "boolean"},
                            "followRedirects": {"type": "boolean"},
                            "enableHttp2": {"type": "boolean"},
                            "tlsConfig": {
                                "type": "object",
                                "additionalProperties": False,
                                "properties": {
                                    "ca": {"type": "object"},
                                    "cert": {"type": "object"},
                                    "keySecret": {"type": "object"},
                                    "caFile": _STR,
                                    "certFile": _STR,
                                    "keyFile": _STR,
                                    "serverName": _STR,
                                    "insecureSkipVerify": {"type": "boolean"},
                                },
                            },
                            "bearerTokenSecret": {"type": "object"},
                            "authorization": {"type": "object"},
                            "relabelings": {"type": "array"},
                            "metricRelabelings": {"type": "array"},
                        },
                    },
                },
            },
        },
    },
}
PROMETHEUS_RULE = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": _METADATA,
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "groups": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name", "rules"],
                        "additionalProperties": False,
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "interval": _DURATION,
                            "limit": {"type": "integer"},
                            "partial_response_strategy": _STR,
                            "rules": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "required": ["expr"],
                                    "additionalProperties": False,
                                    "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                                    "properties": {
                                        "alert": _STR,
                                        "record": _STR,
                                        "expr": {"type": ["string", "integer"]},
                                        "for": _DURATION,
                                        "keep_firing_for": _DURATION,
                                        "labels": _LABELS,
                                        "annotations": _LABELS,
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}
CRD_SHAPES = {"ServiceMonitor": SERVICE_MONITOR, "PrometheusRule": PROMETHEUS_RULE}


class Failed(Exception):
    pass


def documents(rendered):
    """(template, document) of every non-empty manifest; NOTES.txt is text, not a manifest."""
    for template, text in sorted(rendered.items()):
        if template.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                yield template, doc


def lint(values, case):
    report = helm.lint(str(CHART), values, strict=True, kube_version="v" + KUBERNETES_VERSION)
    problems = [m for m in report["messages"] if m["severity"] >= 2] + report.get("errors", [])
    if problems:
        raise Failed(f"helm lint ({case}): {problems}")


def validate(template, doc, case):
    kind = doc.get("kind")
    where = f"{case}: {template} ({kind} {doc.get('metadata', {}).get('name')})"
    if kind in CRD_SHAPES:
        try:
            jsonschema.validate(doc, CRD_SHAPES[kind])
        except jsonschema.ValidationError as e:
            raise Failed(f"{where}: not the shape of its CRD: {e.message} at {list(e.absolute_path)}")
        return
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        raise Failed(f"{where}: {e.message} at {list(e.path)}")
    except kubernetes_validate.SchemaNotFoundError as e:
        raise Failed(f"{where}: {e.message}")


def check_case(case, values, out):
    lint(values, case)
    chart = helm.Chart.load(str(CHART))
    chart.validate_schema(values)
    rendered = chart.render(copy.deepcopy(values), name="berth", namespace="berth-system", is_install=True)
    kinds = []
    for template, doc in documents(rendered):
        validate(template, doc, case)
        kinds.append(doc["kind"])
        if out:
            directory = out / case
            directory.mkdir(parents=True, exist_ok=True)
            name = f"{doc['kind']}-{doc['metadata']['name']}.yaml"
            (directory / name).write_text(yaml.safe_dump(doc, sort_keys=True))
    if out:
        notes = next(text for template, text in rendered.items() if template.endswith("NOTES.txt"))
        (out / case / "NOTES.txt").write_text(notes)
    return sorted(kinds)


def expect_refused(values, field):
    """Rendering `values` fails, and the error names `field`."""
    chart = helm.Chart.load(str(CHART))
    try:
        chart.validate_schema(values)
        chart.render(copy.deepcopy(values), name="berth", namespace="berth-system", is_install=True)
    except helm.HelmError as e:
        if field not in str(e):
            raise Failed(f"values refused without naming {field}: {e}")
        return
    raise Failed(f"values missing or wrong in {field} were accepted: {values}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, help="write the rendered manifests here")
    args = parser.parse_args()
    try:
        for case, values in CASES.items():
            kinds = check_case(case, values, args.out)
            print(f"{case}: lint clean; rendered and valid: {', '.join(kinds)}")
        # Bad values are refused with the field they lack or got wrong.
        expect_refused({}, "lxd.endpoint")
        expect_refused({**REQUIRED, "lxd": {"endpoint": "https://lxd.example:8443"}}, "lxd.secretName")
        expect_refused({**REQUIRED, "tls": {"secretName": ""}}, "tls.secretName")
        expect_refused({**REQUIRED, "lxd": {**REQUIRED["lxd"], "endpoint": "http://lxd:8443"}}, "endpoint")
        expect_refused({**REQUIRED, "config": {"dataDir": "/elsewhere"}}, "config")
        expect_refused({**REQUIRED, "replicas": 2}, "replicas")
        print("refused: missing lxd.endpoint, lxd.secretName, tls.secretName; an http endpoint; config.dataDir; replicas")
    except Failed as e:
        print(f"check-chart: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
