# Rego tests for the runner's own tests: one passes, one fails.
package runner_test

import rego.v1

method := input.request.method

is_get if method == "GET"

test_passes if {
	is_get with input.request.method as "GET"
}

test_fails if {
	is_get with input.request.method as "POST"
}
