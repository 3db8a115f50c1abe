#!/usr/bin/env bash
# Regenerates src/gpupool/agent/kubelet/api_pb2.py and api_pb2_grpc.py from the vendored kubelet PodResources
# api.proto. Needs grpcio-tools (pip install grpcio-tools; not a runtime dependency). The generated code checks at
# import that the installed grpcio and protobuf are at least the versions it was made with: keep pyproject's
# floors for grpcio and protobuf at or above what this prints.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
"$PY" -m grpc_tools.protoc -I src --python_out=src --grpc_python_out=src src/gpupool/agent/kubelet/api.proto
"$PY" - <<'PYEOF'
import grpc_tools, google.protobuf
from importlib.metadata import version
print("generated with grpcio-tools", version("grpcio-tools"), "protobuf", google.protobuf.__version__)
PYEOF
