#!/usr/bin/env bash
# gpu-check.sh: the node agent against this machine's real GPUs, in one short run (about a minute).
#
#   scripts/gpu-check.sh                      # NVML (nvidia-ml-py) on this machine
#   scripts/gpu-check.sh --keep               # keep the work directory (report.json, metrics.txt, smi.xml)
#
# 1. `gpupool agent --backend nvml --dry-run`: discovery, health and stack validation, the report as JSON;
# 2. the agent with its metrics endpoint on 127.0.0.1 for a few seconds (no API server: publishing fails and
#    is retried, which is expected here), /metrics, /healthz and /readyz fetched with curl, then SIGTERM;
# 3. `nvidia-smi -q -x` side by side with what the agent found: product, memory, UUID, minor, PCI bus id,
#    driver, CUDA, MIG mode and MIG devices, per GPU.
# Exit codes: 0 everything matches; 1 a mismatch (the table marks it) or the metrics endpoint failed;
# 3 no NVIDIA driver (nvidia-smi missing or failing, or the agent cannot load NVML).
# Uses the repository's .venv (created with `make` when missing: the only network it needs is pip's).
# Knobs (for testing the script without a GPU): NVIDIA_SMI (the nvidia-smi command), GPU_CHECK_BACKEND_ARGS
# (e.g. "--backend fake --fake-file ../shared/reference/nvml-h200/nvml.json"), GPU_CHECK_TIMEOUT (s, 120).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
KEEP=0
[ "${1:-}" = "--keep" ] && KEEP=1
SMI=${NVIDIA_SMI:-nvidia-smi}
read -r -a BACKEND <<< "${GPU_CHECK_BACKEND_ARGS:---backend nvml}"
LIMIT=${GPU_CHECK_TIMEOUT:-120}
PY="$ROOT/.venv/bin/python"
GPUPOOL=("$PY" -c "from gpupool.cli import main; main()")

say() { printf '== %s\n' "$*"; }

if [ ! -x "$PY" ] || ! "$PY" -c "import gpupool.agent.cli" 2>/dev/null; then
  say "no usable .venv: running make (pip install -e '.[test]')"
  timeout 600 make >/dev/null
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
AGENT_PID=""
cleanup() {
  if [ -n "$AGENT_PID" ] && kill -0 "$AGENT_PID" 2>/dev/null; then kill -KILL "$AGENT_PID" 2>/dev/null || true; fi
  if [ "$KEEP" = 1 ]; then echo "work directory kept: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

# -------------------------------------------------------------- the driver, as nvidia-smi sees it
say "nvidia-smi"
if ! command -v "${SMI%% *}" >/dev/null 2>&1; then
  echo "nvidia-smi not found: no NVIDIA driver on this machine (install the driver, or run on a GPU node)" >&2
  exit 3
fi
if ! timeout 60 $SMI -q -x > "$WORK/smi.xml" 2> "$WORK/smi.err"; then
  echo "nvidia-smi -q -x failed: $(head -c 400 "$WORK/smi.err")" >&2
  echo "check that the NVIDIA kernel module is loaded (lsmod | grep nvidia) and the driver matches it" >&2
  exit 3
fi
timeout 60 $SMI || true

# -------------------------------------------------------------- 1. discovery, health, validation
say "gpupool agent ${BACKEND[*]} --dry-run"
set +e
timeout "$LIMIT" "${GPUPOOL[@]}" agent "${BACKEND[@]}" --dry-run > "$WORK/report.json" 2> "$WORK/dry-run.log"
rc=$?
set -e
if [ $rc -ne 0 ]; then
  cat "$WORK/dry-run.log" >&2
  [ $rc -eq 3 ] && exit 3
  echo "gpupool agent --dry-run exited $rc" >&2
  exit 1
fi
"$PY" - "$WORK/report.json" <<'PYEOF'
import json, sys
doc = json.load(open(sys.argv[1]))
for c in doc["conditions"]:
    print(f"  {c['type']:<14} {c['status']:<8} {c['reason']}: {c['message']}")
print("  labels:")
for k, v in doc["labels"].items():
    print(f"    {k}={v}")
PYEOF

# -------------------------------------------------------------- 2. the metrics endpoint
say "metrics endpoint"
PORTS=$("$PY" -c "
import socket
ss = [socket.socket() for _ in range(2)]
for s in ss: s.bind(('127.0.0.1', 0))
print(' '.join(str(s.getsockname()[1]) for s in ss))")
read -r PORT API_PORT <<< "$PORTS"
cat > "$WORK/kubeconfig" <<KC
apiVersion: v1
kind: Config
current-context: none
clusters: [{name: none, cluster: {server: "https://127.0.0.1:$API_PORT"}}]
users: [{name: none, user: {token: none}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
KC
"${GPUPOOL[@]}" agent "${BACKEND[@]}" --node-name gpu-check --kubeconfig "$WORK/kubeconfig" --interval 2s \
  --metrics-bind-address "127.0.0.1:$PORT" --log-level warning > "$WORK/agent.log" 2>&1 &
AGENT_PID=$!
metrics_ok=0
for _ in $(seq 1 150); do
  if curl -fsS -m 2 "http://127.0.0.1:$PORT/metrics" -o "$WORK/metrics.txt" 2>/dev/null \
      && grep -q '^DCGM_FI_DEV_GPU_TEMP' "$WORK/metrics.txt"; then
    metrics_ok=1; break
  fi
  kill -0 "$AGENT_PID" 2>/dev/null || break
  sleep 0.2
done
healthz=$(curl -s -o /dev/null -w '%{http_code}' -m 2 "http://127.0.0.1:$PORT/healthz" || true)
readyz=$(curl -s -o /dev/null -w '%{http_code}' -m 2 "http://127.0.0.1:$PORT/readyz" || true)
kill -TERM "$AGENT_PID" 2>/dev/null || true
stop_rc=0
for _ in $(seq 1 50); do kill -0 "$AGENT_PID" 2>/dev/null || break; sleep 0.2; done
if kill -0 "$AGENT_PID" 2>/dev/null; then stop_rc=124; else wait "$AGENT_PID" || stop_rc=$?; fi
AGENT_PID=""
echo "  /healthz $healthz, /readyz $readyz, exit after SIGTERM: $stop_rc"
if [ "$metrics_ok" = 1 ]; then
  grep -E '^DCGM_FI_DEV_(GPU_TEMP|POWER_USAGE|FB_USED|FB_FREE|GPU_UTIL|XID_ERRORS)' "$WORK/metrics.txt" | sed 's/^/  /' | awk 'NR <= 20'  # awk reads to the end: no SIGPIPE under pipefail
else
  echo "  no DCGM_FI_DEV_GPU_TEMP on /metrics; agent log:" >&2
  tail -20 "$WORK/agent.log" >&2
fi

# -------------------------------------------------------------- 3. side by side
say "nvidia-smi -q versus gpupool agent"
set +e
"$PY" - "$WORK/smi.xml" "$WORK/report.json" "$WORK/metrics.txt" <<'PYEOF'
import json, sys
import xml.etree.ElementTree as ET
from pathlib import Path

smi = ET.parse(sys.argv[1]).getroot()
doc = json.load(open(sys.argv[2]))
metrics = Path(sys.argv[3]).read_text() if Path(sys.argv[3]).exists() else ""
inv = doc["inventory"]
rows, bad = [], 0

def text(node, path, default=""):
    el = node.find(path)
    return (el.text or "").strip() if el is not None and el.text is not None else default

def row(what, theirs, ours):
    global bad
    same = str(theirs) == str(ours)
    bad += not same
    rows.append((what, str(theirs), str(ours), "" if same else "MISMATCH"))

row("driver", text(smi, "driver_version"), inv.get("driver"))
row("CUDA", text(smi, "cuda_version"), inv.get("cudaDriver"))
gpus = smi.findall("gpu")
row("GPU count", len(gpus), len(inv["gpus"]))
ours = {g["uuid"]: g for g in inv["gpus"]}
for i, g in enumerate(gpus):
    uuid = text(g, "uuid")
    mine = ours.get(uuid, {})
    p = f"GPU {i} "
    row(p + "UUID", uuid, mine.get("uuid", "(not found)"))
    row(p + "product", text(g, "product_name"), mine.get("product"))
    row(p + "memory MiB", text(g, "fb_memory_usage/total").replace(" MiB", ""), mine.get("memoryMiB"))
    row(p + "minor", text(g, "minor_number"), mine.get("minor"))
    bus = text(g, "pci/pci_bus_id")
    row(p + "PCI bus id", bus.lower(), str(mine.get("pciBusId", "")).lower())
    mig_mode = text(g, "mig_mode/current_mig", "N/A")
    mig = mine.get("mig") or {}
    row(p + "MIG mode", mig_mode == "Enabled", bool(mig.get("enabled")))
    smi_migs = len(g.findall("mig_devices/mig_device"))
    row(p + "MIG devices", smi_migs, len(mig.get("instances") or []))
    row(p + "on /metrics", True, uuid in metrics)
    if not mine.get("healthy", False):
        print(f"note: GPU {i} marked unhealthy: {mine.get('reason')}")
w = max(len(r[0]) for r in rows)
w1 = max(len(r[1]) for r in rows)
print(f"{'':<{w}}  {'nvidia-smi -q':<{w1}}  gpupool agent")
for what, theirs, ours_, flag in rows:
    print(f"{what:<{w}}  {theirs:<{w1}}  {ours_}  {flag}")
print(f"{bad} mismatch(es)")
sys.exit(1 if bad else 0)
PYEOF
cmp_rc=$?
set -e
if [ $cmp_rc -ne 0 ] || [ "$metrics_ok" != 1 ] || [ "$healthz" != 200 ] || [ "$stop_rc" != 0 ]; then
  say "FAILED (comparison $cmp_rc, metrics $metrics_ok, healthz $healthz, SIGTERM exit $stop_rc)"
  exit 1
fi
say "OK: the agent's inventory matches nvidia-smi"
