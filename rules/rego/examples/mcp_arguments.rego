# Example with per-tenant data: an agent's MCP tools may act only on the tenant's repositories.
#
#   data:
#     mcp_repositories:
#       tools: [create_issue, create_pull_request, push_files]   # the tools this checks
#       repositories: [acme/api, acme/web]                       # owner/name, any case
#
# The allow rule's `mcp:` section says which tools may be called at all; this says, for the
# listed tools, which repositories their arguments may name: `repo` as "owner/name", or
# `owner` and `repo` apart. A call that names no readable repository is denied too. Use it
# from the tenant's module:
#   import data.sandgate.examples.mcp_arguments
#   deny contains d if some d in mcp_arguments.deny
#
# It reads input.mcp, so the gateway asks the policy about every message of every body an
# `mcp:` rule allows (phase "message"); at the other phases input.mcp is undefined and it
# denies nothing. The message names the tool, never the argument's value.
package sandgate.examples.mcp_arguments

import rego.v1

_config := object.get(data.sandgate.params, "mcp_repositories", {})

_tools := {t | some t in object.get(_config, "tools", [])}

_repositories := {lower(r) | some r in object.get(_config, "repositories", [])}

# The repository a call names, lower-cased (GitHub owners and names are case-insensitive).
repository := lower(r) if {
	r := input.mcp.arguments.repo
	is_string(r)
	contains(r, "/")
} else := lower(concat("/", [o, r])) if {
	o := input.mcp.arguments.owner
	r := input.mcp.arguments.repo
	is_string(o)
	is_string(r)
}

deny contains {
	"reason": "policy_denied",
	"message": sprintf("tool %s may act only on this tenant's repositories", [input.mcp.tool]),
} if {
	input.phase == "message"
	input.mcp.method == "tools/call"
	input.mcp.tool in _tools
	not repository in _repositories
}
