package kube

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/meshmark/meshmark/internal/mesh/meshkube"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
)

// CheckRequirements checks, before a mesh is installed, that the cluster holds every
// object the mesh needs there and none that rules it out (meshkube.ClusterRequirement),
// and names every requirement it fails in one error, with the mesh's own why: a mesh
// that is the cluster's pod network (Cilium) installed over another breaks the
// cluster, so it is refused before anything is created.
func (c *Cluster) CheckRequirements(ctx context.Context, reqs []meshkube.ClusterRequirement) error {
	if len(reqs) > 0 {
		if err := c.checkRights(ctx, meshRights, "installing the mesh"); err != nil {
			return err
		}
	}
	var problems []string
	for _, r := range reqs {
		found, err := c.findObjects(ctx, r)
		if err != nil {
			return fmt.Errorf("checking the cluster for %s %s: %w", r.Kind, where(r.Namespace, r.Name), err)
		}
		switch {
		case r.Absent && len(found) > 0:
			problems = append(problems, fmt.Sprintf("%s %s is there: %s", r.Kind, strings.Join(found, ", "), r.Why))
		case !r.Absent && len(found) == 0:
			problems = append(problems, fmt.Sprintf("%s %s is missing: %s", r.Kind, where(r.Namespace, r.Name), r.Why))
		}
	}
	if len(problems) == 0 {
		return nil
	}
	return errors.New("the cluster cannot take this mesh, nothing was installed:\n  - " + strings.Join(problems, "\n  - "))
}

// findObjects lists the objects of the requirement's kind and name, as NAMESPACE/NAME,
// in its namespace or, when it names none, in every namespace.
func (c *Cluster) findObjects(ctx context.Context, r meshkube.ClusterRequirement) ([]string, error) {
	opts := metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", r.Name).String()}
	var out []string
	switch r.Kind {
	case "DaemonSet":
		list, err := c.client.AppsV1().DaemonSets(r.Namespace).List(ctx, opts)
		if err != nil {
			return nil, err
		}
		for _, o := range list.Items {
			out = append(out, o.Namespace+"/"+o.Name)
		}
	case "Secret":
		list, err := c.client.CoreV1().Secrets(r.Namespace).List(ctx, opts)
		if err != nil {
			return nil, err
		}
		for _, o := range list.Items {
			out = append(out, o.Namespace+"/"+o.Name)
		}
	default:
		return nil, fmt.Errorf("meshmark does not look for objects of kind %s (a bug in the mesh profile)", r.Kind)
	}
	return out, nil
}

func where(namespace, name string) string {
	if namespace == "" {
		return name + " (any namespace)"
	}
	return namespace + "/" + name
}
