# Example: which paths a tenant may request, per host (globs: * within a segment, ** across).
#
#   data:
#     paths:
#       api.github.com: ["/repos/acme/**", "/user"]
#
# Hosts not listed are not limited. Use it from the tenant's module:
#   import data.sandgate.examples.paths
#   deny contains d if some d in paths.deny
package sandgate.examples.paths

import rego.v1

deny contains {
	"reason": "path_not_allowed",
	"message": sprintf("%s is not an allowed path on %s", [input.request.path, input.dest.host]),
} if {
	input.phase == "request"
	globs := object.get(object.get(data.sandgate.params, "paths", {}), input.dest.host, null)
	is_array(globs)
	not _matches(globs, input.request.path)
}

_matches(patterns, path) if {
	some pattern in patterns
	glob.match(pattern, ["/"], path)
}
