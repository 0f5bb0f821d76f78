"""Checks charts/berth offline with the real Helm SDK (PyPI helm-python-sdk): lint and render
with the chart's defaults and with non-default values, every rendered manifest validated
against Kubernetes' schemas (PyPI kubernetes-validate, strict), and the Prometheus operator's
kinds, for which it has no schemas, against models generated from their CRDs (PyPI
cloudcoil-models-prometheus-operator). With --out DIR it also writes each case's manifests
there (DIR/CASE/NAME.yaml) for the tests to read.

Run through scripts/check-chart, which finds the virtualenv scripts/setup-test-deps made."""

import argparse
import copy
import pathlib
import sys

import helm_python as helm
import kubernetes_validate
import pydantic
import yaml
from cloudcoil.models.prometheus_operator import v1 as prometheus_operator

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

# The Prometheus operator's kinds, for which kubernetes-validate has no schemas, are checked
# against models generated from the operator's own CRDs (monitoring.coreos.com/v1, PyPI
# cloudcoil-models-prometheus-operator): their types, enums, required fields and patterns. The
# models ignore fields they do not know, as a cluster prunes them, so a field the CRD lacks (a
# typo the cluster would silently drop) is refused here by comparing the document with what
# the model kept of it.
CRD_MODELS = {"ServiceMonitor": prometheus_operator.ServiceMonitor, "PrometheusRule": prometheus_operator.PrometheusRule}


def unknown_fields(given, kept, path=()):
    """The paths in `given` that `kept` (the model's dump of it) dropped."""
    if isinstance(given, dict):
        if not isinstance(kept, dict):
            return [path]
        found = []
        for key, value in given.items():
            if key not in kept:
                found.append(path + (key,))
            else:
                found += unknown_fields(value, kept[key], path + (key,))
        return found
    if isinstance(given, list) and isinstance(kept, list) and len(given) == len(kept):
        return [p for i, (g, k) in enumerate(zip(given, kept)) for p in unknown_fields(g, k, path + (i,))]
    return []


def check_crd_shape(doc, kind):
    """Raises ValueError naming what `doc` has that its CRD does not accept."""
    try:
        model = CRD_MODELS[kind].model_validate(doc)
    except pydantic.ValidationError as e:
        first = e.errors()[0]
        raise ValueError(f"{first['msg']} at {list(first['loc'])}") from None
    kept = model.model_dump(mode="json", by_alias=True, exclude_unset=True)
    unknown = unknown_fields(doc, kept)
    if unknown:
        raise ValueError(f"fields its CRD does not have: {[list(p) for p in unknown]}")


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
    if kind in CRD_MODELS:
        try:
            check_crd_shape(doc, kind)
        except ValueError as e:
            raise Failed(f"{where}: not the shape of its CRD: {e}")
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
        if doc["kind"] in CRD_MODELS:
            CRD_RENDERED[doc["kind"]] = doc
        if out:
            directory = out / case
            directory.mkdir(parents=True, exist_ok=True)
            name = f"{doc['kind']}-{doc['metadata']['name']}.yaml"
            (directory / name).write_text(yaml.safe_dump(doc, sort_keys=True))
    if out:
        notes = next(text for template, text in rendered.items() if template.endswith("NOTES.txt"))
        (out / case / "NOTES.txt").write_text(notes)
    return sorted(kinds)


# The Prometheus operator's objects the non-default case rendered, for expect_not_crd_shape.
CRD_RENDERED = {}


def expect_not_crd_shape(kind, change, what):
    """The rendered `kind`, changed by `change`, is refused by its CRD's shape."""
    doc = copy.deepcopy(CRD_RENDERED[kind])
    change(doc)
    try:
        check_crd_shape(doc, kind)
    except ValueError:
        return
    raise Failed(f"a {kind} with {what} passed as the shape of its CRD")


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
        # The CRD check itself refuses what a cluster would drop or reject.
        rule = lambda doc: doc["spec"]["groups"][0]["rules"][0]
        endpoint = lambda doc: doc["spec"]["endpoints"][0]
        expect_not_crd_shape("PrometheusRule", lambda d: rule(d).update({"fro": "5m"}), "a misspelt field")
        expect_not_crd_shape("PrometheusRule", lambda d: rule(d).update({"for": "five minutes"}), "a bad duration")
        expect_not_crd_shape("PrometheusRule", lambda d: rule(d).pop("expr"), "a rule without expr")
        expect_not_crd_shape("ServiceMonitor", lambda d: endpoint(d).update({"scheme": "ftp"}), "an unknown scheme")
        expect_not_crd_shape("ServiceMonitor", lambda d: d["spec"].update({"endpoint": []}), "a misspelt field")
        print("refused as not their CRDs' shape: a misspelt field, a bad duration, no expr, a bad scheme")
        print("refused: missing lxd.endpoint, lxd.secretName, tls.secretName; an http endpoint; config.dataDir; replicas")
    except Failed as e:
        print(f"check-chart: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
