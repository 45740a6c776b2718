package cli

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/meshmark/meshmark/internal/cost"
)

func init() {
	register(newCostCommand)
}

func newCostCommand() *cobra.Command {
	var (
		prices, instance   string
		baseVCPU, meshVCPU float64
		baseMiB, meshMiB   float64
		rps                float64
		list               bool
	)
	c := &cobra.Command{
		Use:   "cost",
		Short: "Price a mesh's extra CPU and memory over the baseline on cloud instance types",
		Long: `Turn a mesh's extra vCPU and memory over the baseline (both measured at the same
request rate) into instance-equivalents, money per month and money per million requests.

Prices come from an embedded table of approximate on-demand list prices (each with its
source and date); --prices FILE adds to or replaces entries of that table.`,
		Example: `  meshmark cost --list
  meshmark cost --baseline-vcpu 1.2 --mesh-vcpu 1.7 --baseline-mem-mib 300 --mesh-mem-mib 1324 --rps 1000
  meshmark cost --prices ours.yaml --instance onprem/blade --mesh-vcpu 0.4 --rps 500`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			tab, err := cost.Load(prices)
			if err != nil {
				return withExitCode(2, err)
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 2, 2, ' ', 0)
			defer w.Flush()
			if list {
				fmt.Fprintf(w, "instance\tvCPU\tGiB\t%s/hour\tregion\tas of\tsource\t\n", tab.Currency)
				for _, in := range tab.Instances {
					fmt.Fprintf(w, "%s\t%g\t%g\t%.4f\t%s\t%s\t%s\t\n", in.Name, in.VCPU, in.MemoryGiB, in.PricePerHour, in.Region, in.AsOf, in.Source)
				}
				return nil
			}
			base := cost.Usage{VCPU: baseVCPU, MemoryMiB: baseMiB}
			mesh := cost.Usage{VCPU: meshVCPU, MemoryMiB: meshMiB}
			var ests []cost.Estimate
			if instance != "" {
				e, err := tab.Estimate(instance, base, mesh, rps)
				if err != nil {
					return withExitCode(2, err)
				}
				ests = []cost.Estimate{e}
			} else {
				ests = tab.EstimateAll(base, mesh, rps)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "extra: %+.3f vCPU, %+.3f GiB at %g rps (prices: %s, %g h/month)\n",
				meshVCPU-baseVCPU, (meshMiB-baseMiB)/1024, rps, tab.Origin, tab.HoursPerMonth)
			fmt.Fprintf(w, "instance\tinstances\tbound by\t%[1]s/month\t%[1]s/M req\tas of\t\n", tab.Currency)
			for _, e := range ests {
				perM := "-"
				if rps > 0 {
					perM = fmt.Sprintf("%.4f", e.PerMillionRequests)
				}
				fmt.Fprintf(w, "%s\t%.3f\t%s\t%.2f\t%s\t%s\t\n", e.Instance.Name, e.InstanceEquivalents, e.BoundBy, e.PerMonth, perM, e.Instance.AsOf)
			}
			return nil
		},
	}
	c.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return withExitCode(2, err) })
	fl := c.Flags()
	fl.StringVar(&prices, "prices", "", "price table YAML overriding or extending the embedded one")
	fl.StringVar(&instance, "instance", "", "price on this instance type only (e.g. aws/m6i.large)")
	fl.Float64Var(&baseVCPU, "baseline-vcpu", 0, "average vCPU without the mesh")
	fl.Float64Var(&meshVCPU, "mesh-vcpu", 0, "average vCPU with the mesh")
	fl.Float64Var(&baseMiB, "baseline-mem-mib", 0, "average memory (PSS) without the mesh, MiB")
	fl.Float64Var(&meshMiB, "mesh-mem-mib", 0, "average memory (PSS) with the mesh, MiB")
	fl.Float64Var(&rps, "rps", 0, "achieved request rate both were measured at")
	fl.BoolVar(&list, "list", false, "print the price table")
	return c
}
