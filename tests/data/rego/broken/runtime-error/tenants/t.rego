package sandgate.tenants.t

import rego.v1

# rego-cpp finds an unknown function only when it runs: sandgate runs sample requests.
deny contains "x" if no_such_function(input.dest.host)
