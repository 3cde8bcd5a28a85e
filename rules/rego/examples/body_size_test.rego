# rego-cpp (the embedded engine) replaces fields, not the whole input (`with input.x as`),
# and takes a value, not a rule, after `as`: hence `tenants := _data` in each test.
package sandgate.examples.body_size_test

import rego.v1

import data.sandgate.examples.body_size

_data := {"acme": {"max_body_bytes": {"paste.test": 1048576}}}

test_small_body_is_allowed if {
	tenants := _data
	count(body_size.deny) == 0 with input.phase as "request" with input.tenant as "acme"
		with input.dest.host as "paste.test" with input.request.method as "POST"
		with input.request.body_size as 1000 with data.tenants as tenants
}

test_large_body_is_denied if {
	tenants := _data
	some d in body_size.deny with input.phase as "request" with input.tenant as "acme"
		with input.dest.host as "paste.test" with input.request.method as "POST"
		with input.request.body_size as 2000000 with data.tenants as tenants
	d.reason == "body_too_large"
}

test_unknown_length_post_is_denied if {
	tenants := _data
	count(body_size.deny) == 1 with input.phase as "request" with input.tenant as "acme"
		with input.dest.host as "paste.test" with input.request.method as "POST"
		with input.request.body_size as null with data.tenants as tenants
}

test_unknown_length_get_is_allowed if {
	tenants := _data
	count(body_size.deny) == 0 with input.phase as "request" with input.tenant as "acme"
		with input.dest.host as "paste.test" with input.request.method as "GET"
		with input.request.body_size as null with data.tenants as tenants
}

test_unlisted_host_is_not_limited if {
	tenants := _data
	count(body_size.deny) == 0 with input.phase as "request" with input.tenant as "acme"
		with input.dest.host as "other.test" with input.request.method as "POST"
		with input.request.body_size as 999999999 with data.tenants as tenants
}
