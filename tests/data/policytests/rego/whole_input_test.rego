# rego-cpp cannot replace the whole input under nested rules (is_get → method → input):
# this module's test does not pass, and only this module's.
package whole_input_test

import rego.v1

method := input.request.method

is_get if method == "GET"

test_whole_input_replaced if {
	is_get with input as {"request": {"method": "GET"}}
}
