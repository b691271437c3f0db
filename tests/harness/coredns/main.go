// A minimal CoreDNS for the test cluster's DNS (tests/harness/dns.sh), built by
// tests/harness/build-tools.sh from the coredns Go module at a pinned version.
//
// Why not CoreDNS's own main: it links every plugin, cloud SDKs (AWS, Azure, Google) included,
// which the test cluster never uses and which make the build far longer. This one links only the
// plugins the cluster's Corefile needs: errors, log, health, ready, kubernetes and cache. There is
// no `forward`: the test machine has no upstream resolver, so pods get the cluster's names only.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

// The order the plugins handle a query in (the first wraps the rest), not the order they appear in
// the Corefile: CoreDNS's own order restricted to the plugins above. cache must come before
// kubernetes: a plugin placed after the one that answers never sees the query.
func init() {
	dnsserver.Directives = []string{"ready", "health", "errors", "log", "cache", "kubernetes"}
}

func main() { coremain.Run() }
