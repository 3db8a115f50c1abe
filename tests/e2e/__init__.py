"""End-to-end tests against a real kube-apiserver (a package, so that its conftest does not shadow tests/conftest)."""
