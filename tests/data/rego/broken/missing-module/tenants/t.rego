package sandgate.tenants.t

import rego.v1

deny contains "no" if input.request.method == "DELETE"
