// Package zdsapi is the Go binding of ztunnel's ZDS protocol (zds.proto, copied
// unmodified from github.com/istio/ztunnel commit 62d82653, Copyright Istio Authors,
// Apache-2.0: see LICENSE here): how a node agent hands pods' network namespaces to a
// shared-mode ztunnel. zds.pb.go is generated with
//
//	protoc --go_out=. --go_opt=paths=source_relative \
//	  --go_opt=Mzds.proto=github.com/meshmark/meshmark/internal/mesh/ambient/zdsapi zds.proto
//
// (protoc 3.21.12, protoc-gen-go v1.36.12); do not edit it.
package zdsapi
