"""The kubelet's PodResources API (``v1``), generated from the vendored ``api.proto`` by grpcio-tools.

``api_pb2`` (messages) and ``api_pb2_grpc`` (``PodResourcesListerStub``, ``PodResourcesListerServicer``,
``add_PodResourcesListerServicer_to_server``) are generated code: regenerate them with
``scripts/gen-podresources.sh``, never edit them. :mod:`gpupool.agent.podresources` is what the agent uses.
"""
