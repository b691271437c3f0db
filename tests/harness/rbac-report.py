#!/usr/bin/env python3
"""Print the RBAC each ServiceAccount of the aether chart gets, as one markdown table.

Renders charts/aether with `helm template` (release "aether", namespace "aether-system") for a few
value sets, follows every (Cluster)RoleBinding whose subject is a ServiceAccount to its rules, and
prints one row per (account, scope, API group, resource, resourceNames) with its verbs and the
values under which the rule exists. `make rbac-report` runs it; docs/rbac.md is its committed
output and a test (tests/e2e/charts/docs.rs) fails when they differ.

Usage: rbac-report.py [HELM]   (default: .cache/tools/bin/helm)
Needs PyYAML; when the interpreter lacks it, a venv with it is made once in .cache/pyyaml-venv.
"""
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

try:
    import yaml
except ImportError:  # pragma: no cover - depends on the machine
    venv = os.path.join(REPO, ".cache", "pyyaml-venv")
    py = os.path.join(venv, "bin", "python3")
    if os.environ.get("AETHER_RBAC_REPORT_REEXEC"):
        sys.exit("rbac-report: PyYAML is missing even in " + venv)
    if not os.path.exists(py):
        subprocess.run([sys.executable, "-m", "venv", venv], check=True, stdout=sys.stderr)
        subprocess.run([py, "-m", "pip", "install", "-q", "pyyaml"], check=True, stdout=sys.stderr)
    os.environ["AETHER_RBAC_REPORT_REEXEC"] = "1"
    os.execv(py, [py, os.path.abspath(__file__)] + sys.argv[1:])

RELEASE, NAMESPACE = "aether", "aether-system"
# (--set arguments, the default-values condition a rule missing under them depends on). The first
# is the default install.
VARIANTS = [
    ([], None),
    (["proxy.udsWorkloads.enabled=false"], "`proxy.udsWorkloads.enabled=true`"),
    (["webhook.certs.mode=certManager"], "`webhook.certs.mode=selfSigned`"),
    (["webhook.certs.mode=provided", "webhook.certs.provided.secretName=tls",
      "webhook.certs.provided.caBundle=Y2E="], "`webhook.certs.mode=selfSigned`"),
    (["verifyInstall.enabled=false"], "`verifyInstall.enabled=true`"),
    (["verifyInstall.helmTest=false"], "`verifyInstall.helmTest=true`"),
]
# (--set arguments, the non-default condition under which they add rules): rules found only here.
ADDING_VARIANTS = [
    (["verifyInstall.agentAccess=apiServerProxy"], "`verifyInstall.agentAccess=apiServerProxy`"),
]


def render(helm, sets):
    args = [helm, "template", RELEASE, os.path.join(REPO, "charts", "aether"), "--namespace", NAMESPACE]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def grants(docs):
    """{(sa, scope, group, resource, names): set(verbs)} for every ServiceAccount subject."""
    roles = {}
    for d in docs:
        if d["kind"] in ("Role", "ClusterRole"):
            ns = d["metadata"].get("namespace", NAMESPACE) if d["kind"] == "Role" else None
            roles[(d["kind"], ns, d["metadata"]["name"])] = d.get("rules") or []
    out = {}
    for d in docs:
        if d["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        ref = d["roleRef"]
        bns = d["metadata"].get("namespace", NAMESPACE) if d["kind"] == "RoleBinding" else None
        role_ns = bns if ref["kind"] == "Role" else None
        rules = roles.get((ref["kind"], role_ns, ref["name"]))
        if rules is None:
            raise SystemExit(f"rbac-report: {d['kind']} {d['metadata']['name']} refers to a missing {ref['kind']} {ref['name']}")
        scope = "cluster" if d["kind"] == "ClusterRoleBinding" else f"namespace {bns}"
        for subj in d.get("subjects") or []:
            if subj["kind"] != "ServiceAccount":
                continue
            sa = f"{subj.get('namespace', NAMESPACE)}/{subj['name']}"
            for r in rules:
                for g in r.get("apiGroups") or [""]:
                    for res in r.get("resources") or []:
                        names = ", ".join(r.get("resourceNames") or []) or "*"
                        key = (sa, scope, g or "core", res, names)
                        out.setdefault(key, set()).update(r.get("verbs") or [])
    return out


def aggregated(docs):
    rows = []
    for d in docs:
        labels = d["metadata"].get("labels") or {}
        targets = [k.rsplit("aggregate-to-", 1)[1] for k, v in labels.items()
                   if k.startswith("rbac.authorization.k8s.io/aggregate-to-") and v == "true"]
        if d["kind"] == "ClusterRole" and targets:
            for r in d.get("rules") or []:
                rows.append((d["metadata"]["name"], ", ".join(sorted(targets)),
                             ", ".join(r.get("resources") or []), ", ".join(r.get("verbs") or [])))
    return rows


VERB_ORDER = ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"]


def verbs_text(verbs):
    return ", ".join(sorted(verbs, key=lambda v: (VERB_ORDER.index(v) if v in VERB_ORDER else 99, v)))


def main():
    helm = sys.argv[1] if len(sys.argv) > 1 else os.path.join(REPO, ".cache", "tools", "bin", "helm")
    rendered = [(render(helm, sets), cond) for sets, cond in VARIANTS]
    per_variant = [(grants(docs), cond) for docs, cond in rendered]
    keys = {}
    for i, (g, _) in enumerate(per_variant):
        for k, v in g.items():
            keys.setdefault(k, {})[i] = v
    only_with = {}
    for sets, cond in ADDING_VARIANTS:
        for k, v in grants(render(helm, sets)).items():
            if k not in keys:
                only_with.setdefault(k, ([], set()))[0].append(cond)
                only_with[k][1].update(v)
    print("# RBAC of the aether chart, per ServiceAccount")
    print()
    print("Generated by `make rbac-report` (tests/harness/rbac-report.py); do not edit: a test fails on drift.")
    print("Pods are read cluster-wide because RBAC cannot scope by node: the agent lists and watches with")
    print("the field selector `spec.nodeName=<its node>`. No account can read Secrets outside its namespace")
    print("or write pods. The `verify-install` accounts (the startup check Job's, the `helm test` Pod's) exist")
    print("only while their hook runs: a server-side dry run needs the same `create` as a real one, and stores")
    print("nothing.")
    print()
    print("| ServiceAccount | scope | API group | resource | resourceNames | verbs | granted when |")
    print("|---|---|---|---|---|---|---|")
    for k in sorted(keys):
        present = keys[k]
        verbs = set().union(*present.values())
        if 0 not in present:
            raise SystemExit(f"rbac-report: {k} is granted only under non-default values; add its condition here")
        conds = []
        for i, (_, cond) in enumerate(per_variant):
            if i not in present and cond not in conds:
                conds.append(cond)
        when = " and ".join(conds) if conds else "always"
        sa, scope, group, res, names = k
        print(f"| `{sa}` | {scope} | `{group}` | `{res}` | {names if names == '*' else '`' + names + '`'} "
              f"| {verbs_text(verbs)} | {when} |")
    for k in sorted(only_with):
        conds, verbs = only_with[k]
        sa, scope, group, res, names = k
        print(f"| `{sa}` | {scope} | `{group}` | `{res}` | {names if names == '*' else '`' + names + '`'} "
              f"| {verbs_text(verbs)} | only with {' or '.join(conds)} |")
    print()
    print(f"Rendered from charts/aether as release `{RELEASE}` in namespace `{NAMESPACE}`. ClusterRoles for people,")
    print("aggregated into the built-in roles by default (`rbac.aggregateToDefaultRoles: false` keeps them unaggregated):")
    print()
    for name, targets, res, verbs in aggregated(rendered[0][0]):
        print(f"- `{name}` → {targets}: `{res}` {verbs}")

if __name__ == "__main__":
    main()
