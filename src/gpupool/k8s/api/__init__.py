"""Everything that talks to the Kubernetes API server: requests (wire), list+watch (watch), writes (calls,
events, status), leader election and the client's configuration. Imports k8s conventions and k8s.objects only:
no engine, no policies, no cache or cycle code."""
