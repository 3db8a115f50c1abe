"""``gpupool agent``: flags, exit codes, --dry-run on the recorded H200, --once against an in-memory API,
and the long-running agent as a subprocess (metrics endpoint, SIGTERM ends it cleanly)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpupool.agent import publisher as pub
from gpupool.agent.backend import BackendError
from gpupool.agent.report import ANN_GPU_INVENTORY, ANN_OWNED_LABELS, read_inventory
from gpupool.cli import app
from test_agent_publisher import FakeApi, node

ROOT = Path(__file__).resolve().parents[1]
SHARED_H200 = ROOT.parent / "shared" / "reference" / "nvml-h200" / "nvml.json"  # with the nvidia-smi outputs
H200 = SHARED_H200
if not H200.exists():  # a checkout without the workplace's shared folder: the copy shipped with the tests
    H200 = ROOT / "tests" / "data" / "agent" / "nvml-h200.json"
STANDIN = {"driver": "580.159.04", "cuda_driver": "13.0", "gpus": [{"name": "NVIDIA H200", "memory_mib": 143771}]}


@pytest.fixture
def fake_file(tmp_path: Path) -> Path:
    """The recorded H200 when the workplace has it, else a one-GPU description."""
    if H200.exists():
        return H200
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps(STANDIN))
    return path


def invoke(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(app, ["agent", *args], env={"NODE_NAME": "", **(env or {})}, terminal_width=200)


def test_help_names_every_flag():
    out = invoke("--help").output
    for flag in ("--node-name", "--backend", "--fake-file", "--interval", "--metrics-bind-address", "--mig-strategy",
                 "--kubeconfig", "--once", "--dry-run", "--host-root", "NODE_NAME"):
        assert flag in out, flag
    assert "Exit codes" in out


def test_dry_run_prints_the_report_of_the_recorded_h200(fake_file):
    r = invoke("--backend", "fake", "--fake-file", str(fake_file), "--dry-run")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout[r.stdout.index("{"):])
    assert doc["labels"]["nvidia.com/gpu.count"] == "1"
    assert doc["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H200"
    assert doc["labels"]["nvidia.com/gpu.memory"] == "143771"
    assert doc["labels"]["nvidia.com/mig.strategy"] == "mixed"
    assert doc["labels"]["gpupool.io/gpu-stack-ready"] in ("true", "false")
    (gpu,) = doc["inventory"]["gpus"]
    assert gpu["healthy"] is True and gpu["memoryMiB"] == 143771 and gpu["uuid"].startswith("GPU-")
    assert [c["type"] for c in doc["conditions"]] == ["GpuHealthy", "GpuStackReady"]
    assert doc["conditions"][0]["status"] == "True"


@pytest.mark.parametrize("args, message", [
    ((), "no node name"),
    (("--node-name", "n", "--interval", "soon"), "not a duration"),
    (("--node-name", "n", "--interval", "0s"), "must be positive"),
    (("--node-name", "n", "--mig-strategy", "some"), "--mig-strategy: 'some' is not one of none, single, mixed"),
    (("--node-name", "n", "--backend", "fake"), "--fake-file"),
    (("--node-name", "n", "--backend", "cuda"), "--backend: 'cuda' is not one of nvml, fake\n"),
    (("--node-name", "n", "--fake-file", "x.json"), "goes with --backend fake"),
    (("--node-name", "n", "--backend", "fake", "--fake-file", "/nonexistent.json"), "no such file"),
    (("--node-name", "n", "--backend", "fake", "--fake-file", "/dev/null"), "not a regular file"),
    (("--dry-run", "--once"), "choose one"),
    (("--log-level", "loud", "--dry-run"), "log level"),
])
def test_bad_usage_exits_2(args, message):
    r = invoke(*args)
    assert r.exit_code == 2, r.output
    assert message in r.output


def test_bad_fake_description_exits_2(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("nodes: []\n")
    r = invoke("--backend", "fake", "--fake-file", str(path), "--dry-run")
    assert r.exit_code == 2 and "unknown field 'nodes' at the top level; did you mean 'node'?" in r.output
    path.write_text("node: n\n")
    r = invoke("--backend", "fake", "--fake-file", str(path), "--dry-run")
    assert r.exit_code == 2 and "not a fake GPU description" in r.output


def test_a_backend_typo_is_named_before_the_fake_file_check(tmp_path):
    # before: "--fake-file goes with --backend fake", as if the user had meant another backend
    r = invoke("--backend", "fak", "--fake-file", str(tmp_path / "gpus.yaml"), "--dry-run")
    assert r.exit_code == 2
    assert r.output == "error: --backend: 'fak' is not one of nvml, fake; did you mean 'fake'?\n"


@pytest.mark.parametrize("name, text, where", [
    ("gpus.yaml", "gpus:\n  - index: 0\n    memory_mb: 1024\n", "3:5: unknown field 'memory_mb' in gpus[0]"),
    ("gpus.yaml", "defaults: {memory_mb: 1024}\ngpus: [{count: 2}]\n", "1:12: unknown field 'memory_mb' in defaults"),
    ("gpus.json", '{"gpus": [{"index": 0,\n  "memory_mb": 1024}]}', "2:3: unknown field 'memory_mb' in gpus[0]"),
])
def test_a_typo_in_a_fake_description_names_the_line_column_and_field_meant(tmp_path, name, text, where):
    # before: memory_mb was ignored and the GPU got the default 81559 MiB
    path = tmp_path / name
    path.write_text(text)
    r = invoke("--backend", "fake", "--fake-file", str(path), "--dry-run")
    assert r.exit_code == 2
    assert r.output == f"error: {path}:{where}; did you mean 'memory_mib'?\n"


def test_a_bad_indent_in_a_fake_description_is_one_line(tmp_path):
    path = tmp_path / "gpus.yaml"
    path.write_text("gpus:\n  - index: 0\n   name: x\n")
    r = invoke("--backend", "fake", "--fake-file", str(path), "--dry-run")
    assert r.exit_code == 2 and len(r.output.splitlines()) == 1
    assert r.output.startswith(f"error: {path}:3:4: invalid YAML: ")


def test_no_driver_exits_3_with_what_to_check(monkeypatch):
    import gpupool.agent.nvml as nvml

    class NoDriver:
        def __init__(self, *a, **kw):
            raise BackendError("NVML Shared Library Not Found")

    monkeypatch.setattr(nvml, "NvmlBackend", NoDriver)
    for args in (("--dry-run",), ("--node-name", "n", "--once")):
        r = invoke("--backend", "nvml", *args)
        assert r.exit_code == 3, r.output
        assert "NVML is not available: NVML Shared Library Not Found" in r.output
        assert "nvidia-smi" in r.output and "runtimeClassName nvidia" in r.output


def test_node_name_from_the_environment_and_once_publishes(monkeypatch, fake_file):
    api = FakeApi(node())
    monkeypatch.setattr(pub.wire, "call", api.call)
    monkeypatch.setattr("gpupool.k8s.api.client.load_api_client", lambda *a, **kw: object())
    r = invoke("--backend", "fake", "--fake-file", str(fake_file), "--once", env={"NODE_NAME": "gpu-1"})
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["node"] == "gpu-1" and out["written"] is True and out["ok"] is True
    md = api.node["metadata"]
    assert md["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H200"
    assert "nvidia.com/gpu.product" in md["annotations"][ANN_OWNED_LABELS]
    assert read_inventory(md["annotations"])["gpus"][0]["healthy"] is True
    assert ANN_GPU_INVENTORY in md["annotations"]
    types = {c["type"]: c["status"] for c in api.node["status"]["conditions"]}
    # allocatable nvidia.com/gpu 1 = 1 GPU; RuntimeClass nvidia listed: the stack is ready
    assert types == {"Ready": "True", "GpuHealthy": "True", "GpuStackReady": "True"}, api.node["status"]
    # a second --once changes nothing
    n = len(api.writes())
    r = invoke("--backend", "fake", "--fake-file", str(fake_file), "--once", "--node-name", "gpu-1")
    assert r.exit_code == 0 and json.loads(r.stdout.strip().splitlines()[-1])["written"] is False
    assert len(api.writes()) == n


def test_once_exits_1_when_the_node_cannot_be_written(monkeypatch, fake_file):
    from kubernetes.client.exceptions import ApiException

    api = FakeApi(node())
    api.fail = [ApiException(status=403, reason="Forbidden")] * 100
    monkeypatch.setattr(pub.wire, "call", api.call)
    monkeypatch.setattr("gpupool.k8s.api.client.load_api_client", lambda *a, **kw: object())
    r = invoke("--backend", "fake", "--fake-file", str(fake_file), "--once", "--node-name", "gpu-1")
    assert r.exit_code == 1, r.output
    assert "403" in json.loads(r.stdout.strip().splitlines()[-1])["error"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except OSError:
        return 0, ""


def test_agent_serves_metrics_and_stops_on_sigterm(tmp_path, fake_file):
    """No API server (the kubeconfig points at a closed port): publishing fails and is retried, the loop and
    the metrics endpoint go on, SIGTERM ends the process with 0 within seconds."""
    port, api_port = _free_port(), _free_port()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{api_port}"}}],
        "users": [{"name": "u", "user": {"token": "x"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    exe = [sys.executable, "-c", "from gpupool.cli import main; main()"]
    proc = subprocess.Popen([*exe, "agent", "--backend", "fake", "--fake-file", str(fake_file), "--node-name", "n1",
                             "--kubeconfig", str(kubeconfig), "--interval", "1s",
                             "--metrics-bind-address", f"127.0.0.1:{port}"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "NODE_NAME": ""})
    try:
        deadline = time.monotonic() + 30
        body = ""
        while time.monotonic() < deadline:
            code, body = _get(f"http://127.0.0.1:{port}/metrics")
            if code == 200 and "DCGM_FI_DEV_GPU_TEMP" in body:
                break
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            time.sleep(0.2)
        assert "DCGM_FI_DEV_GPU_TEMP" in body and "DCGM_FI_DEV_FB_USED" in body
        assert _get(f"http://127.0.0.1:{port}/healthz")[0] == 200
        assert _get(f"http://127.0.0.1:{port}/readyz")[0] == 200
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(10)
        stopped_s = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    out = proc.stdout.read() if proc.stdout else ""
    assert rc == 0, out
    assert stopped_s < 5, out
    assert "agent stopped after" in out and "failed" in out  # publishing failed, the loop went on


# ---------------------------------------------------------------------- scripts/gpu-check.sh without a GPU
def _fake_smi(tmp_path: Path) -> Path:
    """An nvidia-smi that answers with the H200 recording's outputs."""
    ref = SHARED_H200.parent
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"""#!/bin/sh
if [ "$1" = "-q" ] && [ "$2" = "-x" ]; then cat {ref}/nvidia-smi-q.xml
elif [ "$1" = "-q" ]; then cat {ref}/nvidia-smi-q.txt
else cat {ref}/nvidia-smi.txt; fi
""")
    smi.chmod(0o755)
    return smi


@pytest.mark.skipif(not SHARED_H200.exists() or not shutil.which("curl"),
                    reason="needs the H200 recording with its nvidia-smi outputs (../shared) and curl")
@pytest.mark.parametrize("fake, rc", [(SHARED_H200, 0), (ROOT / "examples" / "agent" / "dgx-h100.yaml", 1)])
def test_gpu_check_script_compares_with_nvidia_smi(tmp_path, fake, rc):
    """The recorded H200 (the FakeBackend replaying nvml.json) against the recorded nvidia-smi -q -x: all equal;
    an 8-GPU DGX description against the same nvidia-smi: mismatches, exit 1."""
    if not fake.exists():
        pytest.skip(f"{fake} not present")
    env = {**os.environ, "NVIDIA_SMI": str(_fake_smi(tmp_path)),
           "GPU_CHECK_BACKEND_ARGS": f"--backend fake --fake-file {fake}"}
    out = subprocess.run(["bash", str(ROOT / "scripts" / "gpu-check.sh")], capture_output=True, text=True, env=env,
                         timeout=180)
    assert out.returncode == rc, out.stdout[-3000:] + out.stderr[-2000:]
    if rc == 0:
        assert "0 mismatch(es)" in out.stdout and "GPU 0 UUID" in out.stdout
        assert "/healthz 200, /readyz 200, exit after SIGTERM: 0" in out.stdout
    else:
        assert "MISMATCH" in out.stdout


def test_gpu_check_script_exits_3_without_a_driver(tmp_path):
    env = {**os.environ, "NVIDIA_SMI": str(tmp_path / "no-nvidia-smi")}
    out = subprocess.run(["bash", str(ROOT / "scripts" / "gpu-check.sh")], capture_output=True, text=True, env=env,
                         timeout=60)
    assert out.returncode == 3 and "no NVIDIA driver" in out.stderr
