# Example: request body limits per host, e.g. nothing over 1 MiB to paste sites.
#
#   data:
#     max_body_bytes:
#       pastebin.com: 1048576
#       "*": 104857600                # any other host (optional)
#
# The size is the declared length (Content-Length). A body of unknown length (chunked) to
# a limited host is refused for methods that carry one. Use it from the tenant's module:
#   import data.sandgate.examples.body_size
#   deny contains d if some d in body_size.deny
package sandgate.examples.body_size

import rego.v1

_config := object.get(data.sandgate.params, "max_body_bytes", {})

limit := object.get(_config, input.dest.host, object.get(_config, "*", null))

deny contains {
	"reason": "body_too_large",
	"message": sprintf("a %d-byte body is over the %d-byte limit for %s", [input.request.body_size, limit, input.dest.host]),
} if {
	input.phase == "request"
	is_number(limit)
	is_number(input.request.body_size)
	input.request.body_size > limit
}

deny contains {
	"reason": "body_too_large",
	"message": sprintf("a body of unknown length to %s (limit %d bytes)", [input.dest.host, limit]),
} if {
	input.phase == "request"
	is_number(limit)
	input.request.body_size == null
	input.request.method in {"POST", "PUT", "PATCH"}
}
