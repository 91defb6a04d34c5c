// Command pause is the local node's sandbox (pause) image: it holds a pod's namespaces and waits
// for SIGTERM or SIGINT. No registry is reachable here, so the node cannot pull the upstream one.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	<-signals
}
