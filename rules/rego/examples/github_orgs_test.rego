# rego-cpp (the embedded engine) replaces fields, not the whole input (`with input.x as`),
# and takes a value, not a rule, after `as`: hence `tenants := _data` in each test.
package sandgate.examples.github_orgs_test

import rego.v1

import data.sandgate.examples.github_orgs

_data := {"acme": {"github_orgs": ["Acme"]}}

test_write_to_own_org_is_allowed if {
	tenants := _data
	count(github_orgs.deny) == 0 with input.phase as "request" with input.tenant as "acme"
		with input.dest.host as "api.github.com" with input.request.method as "POST"
		with input.request.path as "/repos/acme/tools/issues" with data.tenants as tenants
}

test_write_to_other_org_is_denied if {
	tenants := _data
	count(github_orgs.deny) == 1 with input.phase as "request" with input.tenant as "acme"
		with input.dest.host as "api.github.com" with input.request.method as "PATCH"
		with input.request.path as "/repos/evil/tools" with data.tenants as tenants
}

test_read_from_other_org_is_allowed if {
	tenants := _data
	count(github_orgs.deny) == 0 with input.phase as "request" with input.tenant as "acme"
		with input.dest.host as "api.github.com" with input.request.method as "GET"
		with input.request.path as "/repos/evil/tools" with data.tenants as tenants
}

test_git_push_to_other_org_is_denied if {
	tenants := _data
	count(github_orgs.deny) == 1 with input.phase as "request" with input.tenant as "acme"
		with input.dest.host as "github.com" with input.request.method as "POST"
		with input.request.path as "/evil/tools.git/git-receive-pack" with data.tenants as tenants
}

test_git_push_to_own_org_is_allowed if {
	tenants := _data
	count(github_orgs.deny) == 0 with input.phase as "request" with input.tenant as "acme"
		with input.dest.host as "github.com" with input.request.method as "POST"
		with input.request.path as "/ACME/tools.git/git-receive-pack" with data.tenants as tenants
}

test_clone_from_other_org_is_allowed if {
	tenants := _data
	count(github_orgs.deny) == 0 with input.phase as "request" with input.tenant as "acme"
		with input.dest.host as "github.com" with input.request.method as "POST"
		with input.request.path as "/evil/tools.git/git-upload-pack" with data.tenants as tenants
}

test_write_without_owner_is_denied if {
	tenants := _data
	count(github_orgs.deny) == 1 with input.phase as "request" with input.tenant as "acme"
		with input.dest.host as "api.github.com" with input.request.method as "POST"
		with input.request.path as "/graphql" with data.tenants as tenants
}

test_other_hosts_are_not_checked if {
	tenants := _data
	count(github_orgs.deny) == 0 with input.phase as "request" with input.tenant as "acme"
		with input.dest.host as "pypi.org" with input.request.method as "POST"
		with input.request.path as "/legacy/" with data.tenants as tenants
}
