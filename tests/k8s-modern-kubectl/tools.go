//go:build tools

// Package tools pins the kubectl tests/scripts/helm.sh builds. Its go.mod starts as
// ../k8s-modern's (the 1.37 control plane's module graph) and also imports what that module
// builds, so that `go mod tidy` selects the very versions the control plane is built from
// and only adds what kubectl needs beyond them (helm.sh checks that no shared module differs).
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
