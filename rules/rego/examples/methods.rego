# Example: which HTTP methods a tenant may use, per host.
#
#   data:
#     methods:
#       api.github.com: [GET, HEAD]   # this host: these methods only
#       "*": [GET]                    # any other host (optional; without it: no limit)
#
# Use it from the tenant's module:
#   import data.sandgate.examples.methods
#   deny contains d if some d in methods.deny
package sandgate.examples.methods

import rego.v1

deny contains {
	"reason": "method_not_allowed",
	"message": sprintf("%s is not allowed to %s", [input.request.method, input.dest.host]),
} if {
	input.phase == "request"
	config := object.get(data.sandgate.params, "methods", {})
	allowed := object.get(config, input.dest.host, object.get(config, "*", null))
	is_array(allowed)
	not input.request.method in allowed
}
