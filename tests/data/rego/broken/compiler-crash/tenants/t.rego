package sandgate.tenants.t

import rego.v1

# rego-cpp's bundle builder aborts its process on this (a `with` over the whole input):
# sandgate compiles in a separate process, so it is reported, not fatal.
e := input.m

d := e

deny contains "x" if {
	x := d with input as {"m": "POST"}
	x == "POST"
}
