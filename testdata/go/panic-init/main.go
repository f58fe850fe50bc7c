// panic-init: a Go filter whose package initialisation panics, as a bad configuration
// default or a failed regexp.MustCompile would: _initialize fails before any proxy-wasm
// callback, after the guest has written its own lines.
package main

import (
	"fmt"
	"os"

	"proxywasm.test/guests/proxy"
)

func main() {}

func init() {
	proxy.SetVMContext(nil)
	fmt.Println("go panic-init: starting, LEVEL=" + os.Getenv("LEVEL"))
	panic("go panic-init: no configuration")
}
