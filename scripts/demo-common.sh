# Sourced by scripts/demo.sh and scripts/demo-nodes.sh: what both demos share. Needs $repo and,
# for kubectl and helm, $tools (the Go-built binaries) and $work (the demo's folder).
#   step TEXT      a bold heading
#   indent         indents standard input by four spaces
#   kubectl, helm  the tools dir's, helm with its cache, config and data under $work
#   crds_chart, aether_chart
#                  the packaged charts `make charts` wrote (.cache/charts/<name>-<version>.tgz),
#                  which the README's Quickstart installs
#   images         `-f examples/quickstart/local-images.yaml`: the Quickstart's values pointing
#                  the chart at the images `make images` built here (never pulled)

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
indent() { sed 's/^/    /'; }
kubectl() { "$tools/kubectl" "$@"; }
helm() { HELM_CACHE_HOME=$work/helm HELM_CONFIG_HOME=$work/helm HELM_DATA_HOME=$work/helm "$tools/helm" "$@"; }

# chart_version NAME: the version in charts/NAME/Chart.yaml.
chart_version() { sed -n 's/^version: *//p' "$repo/charts/$1/Chart.yaml"; }
crds_chart=$repo/.cache/charts/aether-crds-$(chart_version aether-crds).tgz
aether_chart=$repo/.cache/charts/aether-$(chart_version aether).tgz
for chart in "$crds_chart" "$aether_chart"; do
  [ -f "$chart" ] || { echo "demo: $chart is missing: run make charts (make demo does)" >&2; exit 1; }
done
images=(-f "$repo/examples/quickstart/local-images.yaml")
# The images `make images` built: release binaries. node.sh imports .cache/images, rebuilding a
# tarball only if its inputs changed, with this profile.
export AETHER_IMAGE_PROFILE=release
