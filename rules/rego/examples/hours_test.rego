# rego-cpp (the embedded engine) replaces fields, not the whole input (`with input.x as`),
# and takes a value, not a rule, after `as`: hence `tenants := _data` in each test.
package sandgate.examples.hours_test

import rego.v1

import data.sandgate.examples.hours

_data := {"acme": {"hours": {"timezone": "UTC", "start": 8, "end": 19, "outside_methods": ["GET"]}}}

# Wednesday 2023-11-15, 10:00 and 22:00 UTC; Saturday 2023-11-18, 10:00 UTC.
_wednesday_10 := 1700042400000000000

_wednesday_22 := 1700085600000000000

_saturday_10 := 1700301600000000000

test_inside_the_window_anything_goes if {
	tenants := _data
	count(hours.deny) == 0 with input.phase as "request" with input.tenant as "acme"
		with input.request.method as "POST" with data.tenants as tenants
		with data.sandgate.examples.hours.now_ns as _wednesday_10
}

test_after_hours_post_is_denied if {
	tenants := _data
	count(hours.deny) == 1 with input.phase as "request" with input.tenant as "acme"
		with input.request.method as "POST" with data.tenants as tenants
		with data.sandgate.examples.hours.now_ns as _wednesday_22
}

test_after_hours_get_is_allowed if {
	tenants := _data
	count(hours.deny) == 0 with input.phase as "request" with input.tenant as "acme"
		with input.request.method as "GET" with data.tenants as tenants
		with data.sandgate.examples.hours.now_ns as _wednesday_22
}

test_weekend_is_outside if {
	tenants := _data
	count(hours.deny) == 1 with input.phase as "request" with input.tenant as "acme"
		with input.request.method as "PUT" with data.tenants as tenants
		with data.sandgate.examples.hours.now_ns as _saturday_10
}

test_timezone_shifts_the_window if {
	# 22:00 UTC is 07:00 the next day in Tokyo: before the window opens.
	tokyo := {"acme": {"hours": {"timezone": "Asia/Tokyo", "start": 8, "end": 19}}}
	count(hours.deny) == 1 with input.phase as "request" with input.tenant as "acme"
		with input.request.method as "GET" with data.tenants as tokyo
		with data.sandgate.examples.hours.now_ns as _wednesday_22
}
