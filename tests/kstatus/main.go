// kstatus reads Kubernetes objects as JSON (one per line on stdin) and prints, one JSON line each,
// the status the real kstatus library (sigs.k8s.io/cli-utils/pkg/kstatus/status) computes for it:
// the verdict Flux's health checks and Helm 4's --wait act on. tests/e2e/kstatus.rs feeds it the
// Projections and ClusterProjections the controller reported on, in every reason.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

type verdict struct {
	Name    string `json:"name"`
	Status  string `json:"status"`
	Message string `json:"message"`
	Error   string `json:"error,omitempty"`
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 16<<20)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		if len(in.Bytes()) == 0 {
			continue
		}
		obj := &unstructured.Unstructured{}
		if err := obj.UnmarshalJSON(in.Bytes()); err != nil {
			fmt.Fprintf(os.Stderr, "kstatus: not an object: %v\n", err)
			os.Exit(2)
		}
		v := verdict{Name: obj.GetName()}
		res, err := status.Compute(obj)
		if err != nil {
			v.Error = err.Error()
		} else {
			v.Status, v.Message = res.Status.String(), res.Message
		}
		if err := out.Encode(v); err != nil {
			os.Exit(3)
		}
	}
	if err := in.Err(); err != nil {
		fmt.Fprintf(os.Stderr, "kstatus: reading stdin: %v\n", err)
		os.Exit(2)
	}
}
