// Command kube-proxy is the upstream Service proxy, built from the published k8s.io/kubernetes
// module (this module's go.mod, shared with kube-apiserver) so the `kubernetes` Service reaches
// the API server from a devenv/node pod.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-proxy/app"
)

func main() {
	os.Exit(cli.Run(app.NewProxyCommand()))
}
