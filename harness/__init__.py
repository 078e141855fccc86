"""Clarion's real parts run locally for tests, benchmarks and chaos scenarios: databases, server
processes, tenants and the providers' fakes. Not part of the installed package."""
