// Package workloadapi is the Go binding of ztunnel's workload API (workload.proto,
// copied unmodified from github.com/istio/ztunnel commit 62d82653, Copyright Istio
// Authors, Apache-2.0: see LICENSE here), the types istiod serves ztunnel over xDS.
// meshmark needs it for the Extension message the authorization API refers to and for
// the Address type an xDS server must answer; sub-package security holds
// authorization.proto. Both are generated with
//
//	protoc --go_out=OUT \
//	  --go_opt=Mworkload.proto=github.com/meshmark/meshmark/internal/mesh/ambient/workloadapi \
//	  --go_opt=Mauthorization.proto=github.com/meshmark/meshmark/internal/mesh/ambient/workloadapi/security \
//	  workload.proto authorization.proto
//
// (protoc 3.21.12, protoc-gen-go v1.36.12); do not edit them.
package workloadapi
