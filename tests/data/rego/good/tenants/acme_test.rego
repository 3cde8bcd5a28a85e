package sandgate.tenants.acme_test

import rego.v1

import data.sandgate.tenants.acme

test_write_to_own_repo_is_allowed if {
	count(acme.deny) == 0 with input.phase as "request" with input.tenant as "acme"
		with input.dest.host as "api.github.com" with input.request.method as "POST"
		with input.request.path as "/repos/acme/tools/issues"
}

test_write_elsewhere_is_denied if {
	count(acme.deny) == 1 with input.phase as "request" with input.tenant as "acme"
		with input.dest.host as "api.github.com" with input.request.method as "POST"
		with input.request.path as "/repos/evil/tools/issues"
}
