package kube

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"encoding/pem"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/meshmark/meshmark/internal/substrate/kube/kubetest"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestApplyWaitsForTheMeshsWebhook: just after a mesh's install, its validating webhook
// may not answer yet (istiod starting), and the API server refuses every object of its
// kinds ("failed calling webhook"). Applying the mesh's configuration then waits for it
// rather than failing the bring-up. The webhook here validates ConfigMaps of one
// namespace, by URL, with nothing listening for its first 3 seconds.
func TestApplyWaitsForTheMeshsWebhook(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	c := connect(t, Config{})
	client := c.Client()
	port, err := kubetest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var reviewed []string
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var review admissionv1.AdmissionReview
		if err := json.NewDecoder(r.Body).Decode(&review); err != nil || review.Request == nil {
			http.Error(w, "not an AdmissionReview", http.StatusBadRequest)
			return
		}
		mu.Lock()
		reviewed = append(reviewed, review.Request.Name)
		mu.Unlock()
		review.Response = &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: true}
		review.Request = nil
		_ = json.NewEncoder(w).Encode(&review)
	}))
	// The server gives the webhook its certificate; it listens only once it "starts".
	srv.Listener.Close()
	srv.StartTLS()
	caBundle := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})

	const ns = "mmtest-webhook"
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"mmtest-webhook": "on"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	url := "https://127.0.0.1:" + strconv.Itoa(port) + "/validate"
	fail, none, timeout := admissionregv1.Fail, admissionregv1.SideEffectClassNone, int32(2)
	webhook := &admissionregv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "mmtest-webhook"},
		Webhooks: []admissionregv1.ValidatingWebhook{{
			Name:                    "configmaps.mmtest.meshmark.dev",
			ClientConfig:            admissionregv1.WebhookClientConfig{URL: &url, CABundle: caBundle},
			Rules:                   []admissionregv1.RuleWithOperations{{Operations: []admissionregv1.OperationType{admissionregv1.Create}, Rule: admissionregv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}}}},
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"mmtest-webhook": "on"}},
			FailurePolicy:           &fail,
			SideEffects:             &none,
			TimeoutSeconds:          &timeout,
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
	if _, err := client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, webhook, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(context.Background(), webhook.Name, metav1.DeleteOptions{})
	})
	// The API server refuses the object while the webhook does not answer.
	probe := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "probe-"}}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		_, err := client.CoreV1().ConfigMaps(ns).Create(ctx, probe, metav1.CreateOptions{})
		if err != nil {
			t.Logf("while the webhook does not answer: %v", err)
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the API server took ConfigMaps while their webhook did not answer: the test proves nothing")
		}
	}

	started := make(chan struct{})
	go func() {
		defer close(started)
		time.Sleep(3 * time.Second)
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			t.Errorf("webhook: %v", err)
			return
		}
		served := &http.Server{Handler: srv.Config.Handler}
		go func() { _ = served.Serve(tls.NewListener(l, srv.TLS)) }()
		t.Cleanup(func() { _ = served.Close() })
	}()
	mi, err := c.InstallMesh(ctx, nil, []string{"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: mesh-config, namespace: " + ns + "}\ndata: {mode: strict}\n"}, nil, nil)
	<-started
	if err != nil {
		t.Fatalf("apply while the mesh's webhook was not up yet: %v; want it to wait for the webhook", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Contains(reviewed, "mesh-config") {
		t.Errorf("the webhook reviewed %v: want the mesh's configuration applied through it, once it answered", reviewed)
	}
	if err := c.UninstallMesh(ctx, mi, nil); err != nil {
		t.Fatal(err)
	}
}
