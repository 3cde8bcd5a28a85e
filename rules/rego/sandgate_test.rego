# Tests of the decision module. rego-cpp (the embedded engine) cannot replace the whole
# input under nested rules (`with input as {...}`): these tests replace fields instead.
package sandgate_test

import rego.v1

import data.sandgate

test_no_denial_allows if {
	d := sandgate.decision with input.version as 1 with input.tenant as "nobody"
	d == {"allow": true, "reason": "allowed"}
}

test_version_2_is_understood if {
	d := sandgate.decision with input.version as 2 with input.tenant as "nobody"
	d == {"allow": true, "reason": "allowed"}
}

test_unknown_version_denies if {
	d := sandgate.decision with input.version as 3 with input.tenant as "nobody"
	d.allow == false
	d.reason == "policy_denied"
	d.message == "unsupported input version"
}

test_string_denial_is_policy_denied if {
	d := sandgate.decision with input.version as 1 with data.sandgate.deny as {"no"}
	d == {"allow": false, "reason": "policy_denied", "message": "no"}
}

test_object_denial_keeps_reason if {
	d := sandgate.decision with input.version as 1
		with data.sandgate.deny as {{"reason": "method_not_allowed", "message": "GET only"}}
	d == {"allow": false, "reason": "method_not_allowed", "message": "GET only"}
}

test_object_denial_without_reason if {
	d := sandgate.decision with input.version as 1 with data.sandgate.deny as {{"message": "m"}}
	d.reason == "policy_denied"
	d.message == "m"
}

test_smallest_reason_wins if {
	d := sandgate.decision with input.version as 1
		with data.sandgate.deny as {{"reason": "path_not_allowed", "message": "b"}, {"reason": "body_too_large", "message": "a"}}
	d.reason == "body_too_large"
}

test_params_are_the_tenants_data if {
	p := sandgate.params with input.tenant as "acme" with data.tenants as {"acme": {"k": 1}, "other": {"k": 2}}
	p == {"k": 1}
}

test_params_of_an_unknown_tenant_are_empty if {
	p := sandgate.params with input.tenant as "nobody" with data.tenants as {"acme": {"k": 1}}
	p == {}
}
