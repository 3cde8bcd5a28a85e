# rego-cpp (the embedded engine) replaces fields, not the whole input (`with input.x as`),
# and takes a value, not a rule, after `as`: hence `tenants := _data` in each test.
package sandgate.examples.mcp_arguments_test

import rego.v1

import data.sandgate.examples.mcp_arguments

_data := {"acme": {"mcp_repositories": {"tools": ["create_issue"], "repositories": ["Acme/API"]}}}

test_a_listed_repository_is_allowed if {
	tenants := _data
	count(mcp_arguments.deny) == 0 with input.phase as "message" with input.tenant as "acme"
		with input.mcp.method as "tools/call" with input.mcp.tool as "create_issue"
		with input.mcp.arguments as {"repo": "acme/api", "title": "x"} with data.tenants as tenants
}

test_owner_and_repo_apart_are_read_together if {
	tenants := _data
	count(mcp_arguments.deny) == 0 with input.phase as "message" with input.tenant as "acme"
		with input.mcp.method as "tools/call" with input.mcp.tool as "create_issue"
		with input.mcp.arguments as {"owner": "ACME", "repo": "api"} with data.tenants as tenants
}

test_another_repository_is_denied if {
	tenants := _data
	denials := mcp_arguments.deny with input.phase as "message" with input.tenant as "acme"
		with input.mcp.method as "tools/call" with input.mcp.tool as "create_issue"
		with input.mcp.arguments as {"repo": "evil/api"} with data.tenants as tenants
	denials == {{
		"reason": "policy_denied",
		"message": "tool create_issue may act only on this tenant's repositories",
	}}
}

test_a_call_naming_no_repository_is_denied if {
	tenants := _data
	count(mcp_arguments.deny) == 1 with input.phase as "message" with input.tenant as "acme"
		with input.mcp.method as "tools/call" with input.mcp.tool as "create_issue"
		with input.mcp.arguments as {"repo": 42} with data.tenants as tenants
}

test_tools_not_listed_are_not_checked if {
	tenants := _data
	count(mcp_arguments.deny) == 0 with input.phase as "message" with input.tenant as "acme"
		with input.mcp.method as "tools/call" with input.mcp.tool as "search_issues"
		with input.mcp.arguments as {"repo": "evil/api"} with data.tenants as tenants
}

test_other_phases_are_not_checked if {
	tenants := _data
	count(mcp_arguments.deny) == 0 with input.phase as "request" with input.tenant as "acme"
		with data.tenants as tenants
}
