# Example with per-tenant data: a tenant may change things only in its own GitHub orgs.
#
#   data:
#     github_orgs: [acme, acme-labs]
#
# Reads (GET, HEAD) go anywhere the allowlist permits; writes through the REST API
# (api.github.com/repos/<owner>/...) and git pushes (github.com/<owner>/<repo>/git-receive-pack)
# only to the listed owners. Use it from the tenant's module:
#   import data.sandgate.examples.github_orgs
#   deny contains d if some d in github_orgs.deny
package sandgate.examples.github_orgs

import rego.v1

orgs := object.get(data.sandgate.params, "github_orgs", [])

_reads := {"GET", "HEAD", "OPTIONS"}

# A write through the REST API: any method but a read.
_write if {
	input.phase == "request"
	input.dest.host == "api.github.com"
	not input.request.method in _reads
}

# A git push (a clone's git-upload-pack is a read, even though it is a POST).
_write if {
	input.phase == "request"
	input.dest.host == "github.com"
	endswith(input.request.path, "/git-receive-pack")
}

# The owner a write names, lower-cased (GitHub owners are case-insensitive).
owner := lower(parts[2]) if {
	input.dest.host == "api.github.com"
	parts := split(input.request.path, "/")
	parts[1] == "repos"
	count(parts) > 3
} else := lower(parts[1]) if {
	input.dest.host == "github.com"
	parts := split(input.request.path, "/")
	count(parts) > 2
}

deny contains {
	"reason": "policy_denied",
	"message": sprintf("writes to GitHub owner %s are not allowed for this tenant", [owner]),
} if {
	_write
	not owner in {lower(o) | some o in orgs}
}

deny contains {
	"reason": "policy_denied",
	"message": sprintf("a %s to %s%s names no repository owner", [input.request.method, input.dest.host, input.request.path]),
} if {
	_write
	not owner
}
