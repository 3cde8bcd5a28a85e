# Example: a time window. Outside working hours, only some methods (reads, say).
#
#   data:
#     hours:
#       timezone: Europe/Paris        # default UTC
#       days: [Monday, Tuesday, Wednesday, Thursday, Friday]   # the default
#       start: 8                      # hour the window opens (inclusive)
#       end: 19                       # hour it closes (exclusive)
#       outside_methods: [GET, HEAD]  # allowed outside the window; default: none
#
# A policy that reads the clock is never cached (each request is evaluated).
# Use it from the tenant's module:
#   import data.sandgate.examples.hours
#   deny contains d if some d in hours.deny
package sandgate.examples.hours

import rego.v1

# Tests replace this: `with data.sandgate.examples.hours.now_ns as ...`.
now_ns := time.now_ns()

_config := object.get(data.sandgate.params, "hours", null)

_local := [now_ns, object.get(_config, "timezone", "UTC")]

_weekdays := ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]

in_window if {
	time.weekday(_local) in object.get(_config, "days", _weekdays)
	hour := time.clock(_local)[0]
	hour >= _config.start
	hour < _config.end
}

deny contains {
	"reason": "policy_denied",
	"message": sprintf("outside working hours %s is not allowed", [input.request.method]),
} if {
	is_object(_config)
	input.phase == "request"
	not in_window
	not input.request.method in object.get(_config, "outside_methods", [])
}
