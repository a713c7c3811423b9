// Command kubelet is the upstream node agent, built from the published k8s.io/kubernetes module
// (this module's go.mod, shared with kube-apiserver) so devenv/node runs a real node.
package main

import (
	"context"
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	os.Exit(cli.Run(app.NewKubeletCommand(context.Background())))
}
