# Sourced by scripts/demo.sh and scripts/demo-nodes.sh: what both demos share. Needs $repo and,
# for kubectl and helm, $tools (the Go-built binaries) and $work (the demo's folder).
#   step TEXT      a bold heading
#   indent         indents standard input by four spaces
#   kubectl, helm  the tools dir's, helm with its cache, config and data under $work
#   crds_chart, aether_chart
#                  arrays: the packaged charts `make charts` wrote (.cache/charts/<name>-<version>.tgz),
#                  which the README's Quickstart installs; with AETHER_DEMO_REGISTRY=HOST:PORT
#                  (`make release-rehearsal`), `oci://HOST:PORT/charts/<name> --version <version>
#                  --plain-http` instead
#   images         `-f examples/quickstart/local-images.yaml`: the Quickstart's values pointing
#                  the chart at the images `make images` built here (never pulled); with
#                  AETHER_DEMO_REGISTRY, the controller and agent images (and so the launcher)
#                  pulled from HOST:PORT/<name>:<appVersion> (pullPolicy Always)
#   registry_hosts CONTAINERD_DIR
#                  with AETHER_DEMO_REGISTRY: CONTAINERD_DIR/certs.d/HOST:PORT/hosts.toml, so the
#                  node's containerd pulls from it over plain HTTP (containerd's docs/hosts.md)
#   url_host IP    IP as a URL writes it (IPv6 in brackets)
#   dual_service NS NAME APP
#                  applies Service NS/NAME (ipFamilyPolicy RequireDualStack, IPv4 then IPv6, port
#                  8080 to the pods labelled app=APP) and prints its two ClusterIPs
#   report_failed  with entries in the caller's `failed` array: lists them and exits 1

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
indent() { sed 's/^/    /'; }
kubectl() { "$tools/kubectl" "$@"; }
helm() { HELM_CACHE_HOME=$work/helm HELM_CONFIG_HOME=$work/helm HELM_DATA_HOME=$work/helm "$tools/helm" "$@"; }

# chart_version NAME: the version in charts/NAME/Chart.yaml.
chart_version() { sed -n 's/^version: *//p' "$repo/charts/$1/Chart.yaml"; }
images=(-f "$repo/examples/quickstart/local-images.yaml")
if [ -n "${AETHER_DEMO_REGISTRY:-}" ]; then
  reg=$AETHER_DEMO_REGISTRY
  crds_chart=("oci://$reg/charts/aether-crds" --version "$(chart_version aether-crds)" --plain-http)
  aether_chart=("oci://$reg/charts/aether" --version "$(chart_version aether)" --plain-http)
  app_version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' "$repo/charts/aether/Chart.yaml")
  for i in controller:aether-controller webhookCerts:aether-controller agent:aether-agent; do
    images+=(--set "images.${i%%:*}.repository=$reg/${i#*:},images.${i%%:*}.tag=$app_version,images.${i%%:*}.pullPolicy=Always")
  done
else
  crds_chart=("$repo/.cache/charts/aether-crds-$(chart_version aether-crds).tgz")
  aether_chart=("$repo/.cache/charts/aether-$(chart_version aether).tgz")
  for chart in "${crds_chart[0]}" "${aether_chart[0]}"; do
    [ -f "$chart" ] || { echo "demo: $chart is missing: run make charts (make demo does)" >&2; exit 1; }
  done
fi

registry_hosts() {
  [ -n "${AETHER_DEMO_REGISTRY:-}" ] || return 0
  mkdir -p "$1/certs.d/$AETHER_DEMO_REGISTRY"
  cat >"$1/certs.d/$AETHER_DEMO_REGISTRY/hosts.toml" <<TOML
server = "http://$AETHER_DEMO_REGISTRY"
[host."http://$AETHER_DEMO_REGISTRY"]
  capabilities = ["pull", "resolve"]
TOML
}
# The images `make images` built: release binaries. node.sh imports .cache/images, rebuilding a
# tarball only if its inputs changed, with this profile.
export AETHER_IMAGE_PROFILE=release

url_host() { case $1 in *:*) echo "[$1]" ;; *) echo "$1" ;; esac; }

dual_service() {
  kubectl apply -f - <<SVC | indent
apiVersion: v1
kind: Service
metadata: {name: $2, namespace: $1}
spec:
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv6]
  selector: {app: $3}
  ports: [{port: 8080, targetPort: 8080}]
SVC
  kubectl -n "$1" get service "$2" -o custom-columns='NAME:.metadata.name,CLUSTER-IPS:.spec.clusterIPs' | indent
}

report_failed() {
  [ ${#failed[@]} -gt 0 ] || return 0
  step "the demo FAILED:"
  printf '    %s\n' "${failed[@]}"
  exit 1
}
