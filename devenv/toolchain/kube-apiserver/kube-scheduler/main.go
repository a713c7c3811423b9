// Command kube-scheduler is the upstream scheduler, built from the published k8s.io/kubernetes
// module (this module's go.mod, shared with kube-apiserver) for devenv/node.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	os.Exit(cli.Run(app.NewSchedulerCommand()))
}
