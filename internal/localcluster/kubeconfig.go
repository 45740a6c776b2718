package localcluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// writeAdminKubeconfig writes a kubeconfig of the cluster alone, its cluster, user and
// context all named after it, with the certificates inline so that it can be merged.
func writeAdminKubeconfig(path, name, server string, p *clusterPKI) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[name] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: p.caPEM}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{ClientCertificateData: p.adminPEM, ClientKeyData: p.adminKeyPEM}
	cfg.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name}
	cfg.CurrentContext = name
	return clientcmd.WriteToFile(*cfg, path)
}

// userKubeconfig is the file a context is merged into, as kubectl picks the file it
// writes: explicit, else $KUBECONFIG's first entry, else ~/.kube/config.
func userKubeconfig(explicit string) (string, error) {
	if explicit != "" {
		return explicit, nil
	}
	if files := filepath.SplitList(os.Getenv("KUBECONFIG")); len(files) > 0 && files[0] != "" {
		return files[0], nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("no kubeconfig to merge into ($KUBECONFIG and $HOME unset): %w", err)
	}
	return filepath.Join(home, ".kube", "config"), nil
}

// mergeKubeconfig adds the cluster's context to the user's kubeconfig, as kind does,
// and makes it current; anything of the same name there is replaced. It returns the
// file it wrote.
func mergeKubeconfig(explicit, name, from string) (string, error) {
	path, err := userKubeconfig(explicit)
	if err != nil {
		return "", err
	}
	src, err := clientcmd.LoadFromFile(from)
	if err != nil {
		return "", err
	}
	dst, err := clientcmd.LoadFromFile(path)
	if errors.Is(err, os.ErrNotExist) {
		dst = clientcmdapi.NewConfig()
	} else if err != nil {
		return "", fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	dst.Clusters[name] = src.Clusters[name]
	dst.AuthInfos[name] = src.AuthInfos[name]
	dst.Contexts[name] = src.Contexts[name]
	dst.CurrentContext = name
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", err
	}
	if err := clientcmd.WriteToFile(*dst, path); err != nil {
		return "", fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	return path, nil
}

// unmergeKubeconfig removes what mergeKubeconfig added, and the current context if it
// was the cluster's. A file that is gone, or no longer has the context, is left alone.
func unmergeKubeconfig(path, name string) error {
	cfg, err := clientcmd.LoadFromFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	if _, ok := cfg.Contexts[name]; !ok {
		return nil
	}
	delete(cfg.Clusters, name)
	delete(cfg.AuthInfos, name)
	delete(cfg.Contexts, name)
	if cfg.CurrentContext == name {
		cfg.CurrentContext = ""
	}
	return clientcmd.WriteToFile(*cfg, path)
}
