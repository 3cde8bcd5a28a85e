"""Rego on the decision path: the `PolicyEngine` protocol, the decision cache, the embedded
engine (rego-cpp in process), the OPA server client, and compiling bundles in worker processes.
"""
