# Sourced by scripts/demo.sh and scripts/demo-nodes.sh: what both demos share. Needs $repo and,
# for kubectl and helm, $tools (the Go-built binaries) and $work (the demo's folder).
#   step TEXT      a bold heading
#   indent         indents standard input by four spaces
#   kubectl, helm  the tools dir's, helm with its cache, config and data under $work
#   images         an array of `--set` flags pointing charts/aether at the images built here
#                  (tests/harness/images.sh; never pulled)

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
indent() { sed 's/^/    /'; }
kubectl() { "$tools/kubectl" "$@"; }
helm() { HELM_CACHE_HOME=$work/helm HELM_CONFIG_HOME=$work/helm HELM_DATA_HOME=$work/helm "$tools/helm" "$@"; }

images=()
for c in controller webhookCerts agent proxy; do
  case $c in
    controller|webhookCerts) img=aether-controller ;;
    agent) img=aether-agent ;;
    proxy) img=envoy ;;
  esac
  images+=(--set "images.$c.repository=localhost/aether/$img" --set "images.$c.tag=dev" --set "images.$c.pullPolicy=Never")
done
