# rego-cpp (the embedded engine) replaces fields, not the whole input (`with input.x as`),
# and takes a value, not a rule, after `as`: hence `tenants := _data` in each test.
package sandgate.examples.paths_test

import rego.v1

import data.sandgate.examples.paths

_data := {"acme": {"paths": {"api.test": ["/repos/acme/**", "/user"]}}}

test_path_under_a_glob_is_allowed if {
	tenants := _data
	count(paths.deny) == 0 with input.phase as "request" with input.tenant as "acme"
		with input.dest.host as "api.test" with input.request.path as "/repos/acme/tools/pulls"
		with data.tenants as tenants
}

test_exact_path_is_allowed if {
	tenants := _data
	count(paths.deny) == 0 with input.phase as "request" with input.tenant as "acme"
		with input.dest.host as "api.test" with input.request.path as "/user"
		with data.tenants as tenants
}

test_other_path_is_denied if {
	tenants := _data
	some d in paths.deny with input.phase as "request" with input.tenant as "acme"
		with input.dest.host as "api.test" with input.request.path as "/repos/evil/x"
		with data.tenants as tenants
	d.reason == "path_not_allowed"
}

test_unlisted_host_is_not_limited if {
	tenants := _data
	count(paths.deny) == 0 with input.phase as "request" with input.tenant as "acme"
		with input.dest.host as "other.test" with input.request.path as "/anything"
		with data.tenants as tenants
}
