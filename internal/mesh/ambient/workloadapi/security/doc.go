// Package security is the Go binding of ztunnel's authorization API
// (authorization.proto, copied unmodified from github.com/istio/ztunnel commit 62d82653,
// Copyright Istio Authors, Apache-2.0: see LICENSE here): the istio.security.Authorization
// resources istiod pushes to ztunnel over xDS. Generated as package workloadapi says;
// do not edit it.
package security
