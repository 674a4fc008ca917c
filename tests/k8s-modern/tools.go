//go:build tools

// Package tools pins the commands tests/scripts/control-plane-modern.sh builds, so that
// `go mod tidy` keeps them (and all they need) in go.mod and go.sum.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
