#!/usr/bin/env bash
# Record the outputs a layout change must not alter (docs/architecture.md, "What proves behaviour unchanged").
#   scripts/golden.sh DIR          write them under DIR (a fresh folder)
#   diff -r OLD NEW                compare two recordings: no output means byte-identical
# Timing fields (decisions per second, wall seconds, ...) are dropped from the JSON outputs, since they
# measure the machine, not the decisions. Run from the repository root with the project's .venv.
set -euo pipefail
out=${1:?usage: scripts/golden.sh DIR}
mkdir -p "$out"
gp=${GPUPOOL:-.venv/bin/gpupool}
py=${PYTHON:-.venv/bin/python}
traces=${GPUPOOL_TRACES:-../shared/traces}
export COLUMNS=120 NO_COLOR=1 TERM=dumb

strip() {  # JSON on stdin -> JSON on stdout without timing fields
  "$py" -c '
import json, re, sys
TIMING = re.compile(r"(per_second|_per_s$|seconds$|_s$|wall|elapsed|duration_s|cpu_time|timestamp|^time$|^meta$)")
def clean(x):
    if isinstance(x, dict):
        return {k: clean(v) for k, v in x.items() if not TIMING.search(k)}
    if isinstance(x, list):
        return [clean(v) for v in x]
    return x
json.dump(clean(json.load(sys.stdin)), sys.stdout, indent=1, sort_keys=True)
print()'
}

"$gp" policies --json > "$out/policies.json"
"$gp" policies --jobs --json > "$out/policies-jobs.json"
"$gp" compare --seed 42 --quiet --json - | strip > "$out/compare.json"
"$gp" compare --jobs "$traces/philly_pollux/philly.csv" --cluster examples/clusters/philly.yaml \
  --max-jobs 3000 --quiet --json - | strip > "$out/compare-jobs.json"
for snap in examples/snapshots/cluster.yaml tests/data/snapshots/small.json; do
  name=$(basename "$snap" | tr . -)
  "$gp" scheduler --dry-run --snapshot "$snap" > "$out/dry-run-$name.txt" 2>&1 || echo "exit $?" >> "$out/dry-run-$name.txt"
  "$gp" scheduler --dry-run --snapshot "$snap" --config deploy/configmap.yaml \
    > "$out/dry-run-$name-config.txt" 2>&1 || echo "exit $?" >> "$out/dry-run-$name-config.txt"
done
"$gp" autoscale simulate --hours 2 --quiet --json - | strip > "$out/autoscale.json"
# every --help, found by walking the Typer/Click command tree
"$py" - "$out" <<'PY'
import sys, typer.main
from click.testing import CliRunner
from gpupool.cli import app
out = sys.argv[1]
cmd = typer.main.get_command(app)
runner = CliRunner()
def walk(c, path):
    r = runner.invoke(cmd, [*path, "--help"], prog_name="gpupool", terminal_width=120, env={"COLUMNS": "120"})
    with open(f"{out}/help-{'-'.join(path) or 'gpupool'}.txt", "w") as f:
        f.write(r.output)
    for name, sub in sorted(getattr(c, "commands", {}).items()):
        walk(sub, [*path, name])
walk(cmd, [])
PY
echo "golden outputs in $out ($(ls "$out" | wc -l) files)"
