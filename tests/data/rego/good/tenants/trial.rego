package sandgate.tenants.trial

import rego.v1

import data.sandgate.examples.methods

deny contains d if some d in methods.deny
