"""sandgate policy: the decision core. Pure: no mitmproxy, no brokers, no proxy import.

`decide()` (decide.py) is the evaluation order, written once; `model/` is what policy files
say (tenant and credential schema, loading), `rego/` the Rego engines behind one protocol.
"""
