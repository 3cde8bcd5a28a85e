# rego-cpp (the embedded engine) replaces fields, not the whole input (`with input.x as`),
# and takes a value, not a rule, after `as`: hence `tenants := _data` in each test.
package sandgate.examples.methods_test

import rego.v1

import data.sandgate.examples.methods

_data := {"acme": {"methods": {"api.test": ["GET", "HEAD"], "*": ["GET"]}}}

test_listed_method_is_allowed if {
	tenants := _data
	count(methods.deny) == 0 with input.phase as "request" with input.tenant as "acme"
		with input.dest.host as "api.test" with input.request.method as "HEAD"
		with data.tenants as tenants
}

test_other_method_is_denied if {
	tenants := _data
	some d in methods.deny with input.phase as "request" with input.tenant as "acme"
		with input.dest.host as "api.test" with input.request.method as "POST"
		with data.tenants as tenants
	d.reason == "method_not_allowed"
}

test_star_applies_to_unlisted_hosts if {
	tenants := _data
	count(methods.deny) == 1 with input.phase as "request" with input.tenant as "acme"
		with input.dest.host as "other.test" with input.request.method as "HEAD"
		with data.tenants as tenants
}

test_connect_phase_is_not_checked if {
	tenants := _data
	count(methods.deny) == 0 with input.phase as "connect" with input.tenant as "acme"
		with input.dest.host as "api.test" with input.request.method as null
		with data.tenants as tenants
}

test_no_config_no_limit if {
	tenants := _data
	count(methods.deny) == 0 with input.phase as "request" with input.tenant as "other"
		with input.dest.host as "api.test" with input.request.method as "DELETE"
		with data.tenants as tenants
}
